package llm

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
)

// maxJSONDepth is encoding/json's bound on nesting: a body nested deeper is
// not JSON, there as here.
const maxJSONDepth = 10000

// requestFields are what cost tokens and {http.inflight.model} read of a
// request body, in one pass: the largest output token count it asks for
// (output, if named), and the model it names.
type requestFields struct {
	output int64
	named  bool
	model  string
}

// readFields reads body's top-level fields: max_tokens,
// max_completion_tokens and max_output_tokens with a non-negative integer
// value, the largest of them the output (not named if there is none), and
// "model" (see modelOf). If body is not a JSON object as encoding/json
// reads it, it names no output and its model is UnknownModel.
//
// It scans the body once, in place, comparing keys byte for byte as the
// backends do (encoding/json would match MAX_TOKENS too): hostile bodies
// (huge, deeply nested, with duplicate or escaped keys) cost one pass and
// no allocation but for escaped keys and the model's name.
func readFields(body []byte) requestFields {
	var f requestFields
	var model []byte
	valid := objectMembers(body, func(m jsonMember) {
		switch name := keyName(body[m.key:m.value-m.colon], len("max_completion_tokens")); {
		case isOutputName(name):
			if n, isCount := tokenCount(body[m.value:m.end]); isCount {
				f.output, f.named = max(f.output, n), true
			}
		case isModelName(name):
			model = body[m.value:m.end]
		}
	})
	if !valid {
		return requestFields{model: UnknownModel}
	}
	f.model = modelOf(model)
	return f
}

// jsonMember is a top-level member of a JSON object, as offsets in its
// body: the key, quoted as written, is body[key:value-colon], colon is the
// bytes from the key's end to the value (the colon and the whitespace
// around it), and the value is body[value:end].
type jsonMember struct {
	key, colon, value, end int
}

// objectMembers calls each with every top-level member of body, in order,
// and reports whether body is a JSON object as encoding/json reads it;
// each may already have been called when it is not (the members before the
// error). It is readFields' scan, shared: one pass, no allocation.
func objectMembers(body []byte, each func(jsonMember)) bool {
	s := jsonScanner{b: body}
	s.space()
	if !s.eat('{') {
		return false
	}
	s.space()
	if !s.eat('}') {
		for {
			s.space()
			var m jsonMember
			m.key = s.i
			if !s.string() {
				return false
			}
			keyEnd := s.i
			s.space()
			if !s.eat(':') {
				return false
			}
			s.space()
			m.value, m.colon = s.i, s.i-keyEnd
			if !s.value(2) {
				return false
			}
			m.end = s.i
			each(m)
			s.space()
			if s.eat('}') {
				break
			}
			if !s.eat(',') {
				return false
			}
		}
	}
	s.space()
	return s.i == len(body)
}

// keyName returns the name quoted, a valid JSON string, spells, escapes
// decoded, or nil for an escaped one too long to spell a name of longest
// bytes: a key is compared
// byte for byte with the names the backends read, and an escaped one
// (max\u005ftokens) is the name it decodes to.
func keyName(quoted []byte, longest int) []byte {
	if bytes.IndexByte(quoted, '\\') < 0 {
		return quoted[1 : len(quoted)-1]
	}
	if len(quoted) > 2+6*longest { // longer than longest with every byte \uXXXX
		return nil
	}
	var name string
	json.Unmarshal(quoted, &name) // valid: cannot fail
	return []byte(name)
}

func isOutputName(name []byte) bool {
	switch string(name) {
	case "max_tokens", "max_completion_tokens", "max_output_tokens":
		return true
	}
	return false
}

// tokenCount returns the value of a JSON number if it is a non-negative
// integer, math.MaxInt64 if it is larger.
func tokenCount(v []byte) (int64, bool) {
	if v[0] != '-' && (v[0] < '0' || v[0] > '9') { // a string, object, array, true, false or null
		return 0, false
	}
	if bytes.IndexAny(v, "-.eE") < 0 { // digits only
		var n int64
		for _, c := range v {
			d := int64(c - '0')
			if n > (math.MaxInt64-d)/10 {
				return math.MaxInt64, true
			}
			n = 10*n + d
		}
		return n, true
	}
	f, _ := strconv.ParseFloat(string(v), 64) // valid JSON: only a range error, with ±Inf
	switch {
	case f < 0 || f != math.Trunc(f):
		return 0, false
	case f >= math.MaxInt64: // 2^63 as a float64
		return math.MaxInt64, true
	}
	return int64(f), true
}

// jsonScanner checks JSON syntax as encoding/json does (json.Valid), moving
// past values without decoding them.
type jsonScanner struct {
	b []byte
	i int
}

func (s *jsonScanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *jsonScanner) eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *jsonScanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// value moves past one value at the given depth (the top-level value is at
// depth 1), and reports whether it is valid. Containers are followed with a
// stack of their opening brackets, not recursion: a body nested 10000 deep
// costs 10 KB, not a goroutine stack of megabytes.
func (s *jsonScanner) value(depth int) bool {
	var fixed [64]byte
	open := fixed[:0]
	for {
		// A value.
		s.space()
		switch c := s.peek(); c {
		case '{', '[':
			if depth+len(open) > maxJSONDepth {
				return false
			}
			s.i++
			s.space()
			if !s.eat(c + 2) { // '}' is '{'+2, ']' is '['+2
				open = append(open, c)
				if c == '{' && !s.member() {
					return false
				}
				continue // to the container's first value
			}
		case '"':
			if !s.string() {
				return false
			}
		case 't':
			if !s.literal("true") {
				return false
			}
		case 'f':
			if !s.literal("false") {
				return false
			}
		case 'n':
			if !s.literal("null") {
				return false
			}
		default:
			if !s.number() {
				return false
			}
		}
		// After a value: close containers, or go on to the next value.
		for {
			if len(open) == 0 {
				return true
			}
			s.space()
			c := open[len(open)-1]
			if s.eat(c + 2) {
				open = open[:len(open)-1]
				continue
			}
			if !s.eat(',') || c == '{' && !s.member() {
				return false
			}
			break
		}
	}
}

// member moves past an object member's key and colon.
func (s *jsonScanner) member() bool {
	s.space()
	if !s.string() {
		return false
	}
	s.space()
	return s.eat(':')
}

// string moves past a string, quotes included.
func (s *jsonScanner) string() bool {
	if !s.eat('"') {
		return false
	}
	for s.i < len(s.b) {
		rest := s.b[s.i:]
		plain := 0
		for plain < len(rest) && !stringSpecial[rest[plain]] {
			plain++
		}
		s.i += plain
		if s.i == len(s.b) {
			return false
		}
		c := s.b[s.i]
		s.i++
		switch {
		case c == '"':
			return true
		case c < 0x20:
			return false
		}
		// A backslash.
		switch s.peek() {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			s.i++
		case 'u':
			s.i++
			for range 4 {
				if !isHex(s.peek()) {
					return false
				}
				s.i++
			}
		default:
			return false
		}
	}
	return false
}

// stringSpecial marks the bytes that end a run of plain characters in a
// string: the quote, the backslash and the control characters, invalid
// unescaped.
var stringSpecial = func() (special [256]bool) {
	for c := range 0x20 {
		special[c] = true
	}
	special['"'], special['\\'] = true, true
	return special
}()

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func (s *jsonScanner) literal(word string) bool {
	if len(s.b)-s.i < len(word) || string(s.b[s.i:s.i+len(word)]) != word {
		return false
	}
	s.i += len(word)
	return true
}

// number moves past a number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *jsonScanner) number() bool {
	s.eat('-')
	if !s.eat('0') && !s.digits() {
		return false
	}
	if s.eat('.') && !s.digits() {
		return false
	}
	if s.eat('e') || s.eat('E') {
		if !s.eat('+') {
			s.eat('-')
		}
		if !s.digits() {
			return false
		}
	}
	return true
}

// digits moves past one digit or more.
func (s *jsonScanner) digits() bool {
	start := s.i
	for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}
