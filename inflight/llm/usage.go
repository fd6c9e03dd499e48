package llm

import (
	"bytes"
	"math"
)

// TokenUsage is the tokens a model reported for one request: Input
// counts the whole prompt, Cached the part of it read from a cache.
type TokenUsage struct {
	Input, Output, Cached int64
}

// Total is the tokens the request held at its end: input and output.
func (u TokenUsage) Total() int64 {
	if u.Input > math.MaxInt64-u.Output {
		return math.MaxInt64
	}
	return u.Input + u.Output
}

// maxUsageObject bounds the usage object captured: real ones are under 400
// bytes, so a bigger one is not a usage report and is passed over.
const maxUsageObject = 4 << 10

// maxUsageDepth is the deepest a "usage" key is read at: 1 in a whole
// response or an OpenAI chat chunk, 2 in a Responses API event's response
// or Anthropic's message_start message. An object a model writes itself,
// such as an Anthropic tool_use input, lies deeper (content[i].input), so a
// "usage" key in it is not read.
const maxUsageDepth = 2

// usageScanner reads the usage an LLM API reports as its response body goes
// by, without keeping the body: it finds each "usage" key outside JSON
// strings and decodes the object that follows. Its zero value is ready to use.
type usageScanner struct {
	// buf captures one usage object. It is allocated at the first one and
	// kept by reset: an array here would make every pooled writer 4 KiB
	// bigger for the many responses that never report usage.
	buf   []byte
	vals  [numUsageFields]int64
	has   uint16 // bit f: vals[f] was read
	final bool   // an output count was read outside message_start

	mode  uint8 // how the next JSON byte is read: scanMode, strMode...
	match uint8 // bytes of "usage" the current string began with; noMatch if not
	esc   bool  // the next byte in a string is escaped
	str   bool  // in a string inside a captured or skipped object
	depth int64 // containers open outside strings, at this point of the body
	obj   int64 // containers open in a captured or skipped object

	line  uint8 // where in its line the scanner is: lineHead, lineJSON or lineEvent
	head  uint8 // bytes of "event:" matched at the line's start
	evLen uint8 // length of evName; len(evName)+1 if longer
	// evName is the current event line's name, as long as the longest
	// looked for with its optional space and CR: a longer one is not it.
	evName     [len(" message_start\r")]byte
	startEvent bool // the current SSE event is a message_start
}

// Modes of the JSON reading.
const (
	scanMode    = iota // outside strings, looking for a key
	strMode            // in a string that may be a "usage" key
	keyMode            // after the key "usage", before its colon
	colonMode          // after `"usage":`, before its value
	captureMode        // copying a usage object into buf
	skipMode           // passing over a usage object too big to capture
)

// Places in a line. An SSE event line is told from a JSON line by its start.
const (
	lineHead  = iota // at the line's start, which may be "event:"
	lineJSON         // in a line of JSON (or an SSE data line)
	lineEvent        // in an SSE event line's name
)

// noMatch marks a string that is not the key "usage".
const noMatch = 0xff

// write reads the next bytes of the body. It never fails and keeps no
// reference to p.
func (s *usageScanner) write(p []byte) {
	for len(p) > 0 {
		if s.line != lineJSON {
			p = s.lineStart(p)
			continue
		}
		// Each line is read apart: JSON strings cannot hold a raw newline, so
		// one ends any string and broken state with it.
		nl := bytes.IndexByte(p, '\n')
		if nl < 0 {
			s.json(p)
			return
		}
		s.json(p[:nl])
		s.newline()
		p = p[nl+1:]
	}
}

// lineStart reads the bytes of a line that may be an SSE event line: at its
// start until it is known not to be one, and an event line's name. It returns
// the bytes that are left.
func (s *usageScanner) lineStart(p []byte) []byte {
	for i, c := range p {
		switch {
		case c == '\n':
			s.newline()
			return p[i+1:]
		case s.line == lineEvent:
			if int(s.evLen) < len(s.evName) {
				s.evName[s.evLen] = c
			}
			s.evLen = min(s.evLen+1, uint8(len(s.evName)+1))
		case c == "event:"[s.head]:
			if s.head++; int(s.head) == len("event:") {
				s.line, s.evLen = lineEvent, 0
			}
		case c == '\r' && s.head == 0:
			// a blank line may end in CRLF
		default:
			s.line = lineJSON
			return p[i:]
		}
	}
	return nil
}

// newline ends a line: it ends any string, and a blank line ends an SSE event
// and resets the JSON state, which lets a cut or broken event not spoil the
// next one.
func (s *usageScanner) newline() {
	switch s.line {
	case lineHead:
		if s.head == 0 { // a blank line
			s.startEvent = false
			s.mode, s.depth, s.esc, s.str = scanMode, 0, false, false
		}
	case lineEvent:
		name := s.evName[:min(int(s.evLen), len(s.evName))]
		name = bytes.TrimSuffix(bytes.TrimPrefix(name, []byte(" ")), []byte("\r"))
		s.startEvent = int(s.evLen) <= len(s.evName) && string(name) == "message_start"
	case lineJSON:
		if s.mode == strMode {
			s.mode = scanMode
		}
		s.esc, s.str = false, false
	}
	s.line, s.head = lineHead, 0
}

// json reads p, part of a line of JSON without its newline.
func (s *usageScanner) json(p []byte) {
	for len(p) > 0 {
		switch s.mode {
		case scanMode:
			p = s.scan(p)
		case strMode:
			p = s.inString(p)
		case keyMode, colonMode:
			p = s.afterKey(p)
		default:
			p = s.object(p)
		}
	}
}

// scan reads JSON outside strings up to the next string, counting the
// containers opened and closed.
func (s *usageScanner) scan(p []byte) []byte {
	for i, c := range p {
		switch c {
		case '"':
			s.mode, s.match = strMode, 0
			return p[i+1:]
		case '{', '[':
			s.depth++
		case '}', ']':
			s.depth = max(s.depth-1, 0)
		}
	}
	return nil
}

// inString reads a string: byte by byte while it may still be the key
// "usage", then by searching for its closing quote.
func (s *usageScanner) inString(p []byte) []byte {
	i := 0
	if s.esc {
		s.esc, s.match, i = false, noMatch, 1
	}
	for ; s.match != noMatch && i < len(p); i++ {
		switch c := p[i]; {
		case c == '"':
			s.mode = scanMode
			if int(s.match) == len("usage") && s.depth <= maxUsageDepth {
				s.mode = keyMode
			}
			return p[i+1:]
		case int(s.match) < len("usage") && c == "usage"[s.match]:
			s.match++
		default:
			s.match = noMatch
			i-- // read c again below: it may be a backslash
		}
	}
	rest := p[i:]
	for {
		q := bytes.IndexByte(rest, '"')
		if q < 0 {
			s.esc = backslashes(rest)%2 == 1
			return nil
		}
		if backslashes(rest[:q])%2 == 0 {
			s.mode = scanMode
			return rest[q+1:]
		}
		rest = rest[q+1:] // an escaped quote
	}
}

// backslashes counts the backslashes p ends with: an odd count escapes the
// byte that follows.
func backslashes(p []byte) int {
	n := 0
	for n < len(p) && p[len(p)-1-n] == '\\' {
		n++
	}
	return n
}

// afterKey reads the colon after a "usage" key and the start of its value:
// an object is captured, anything else (null) is passed over.
func (s *usageScanner) afterKey(p []byte) []byte {
	for i, c := range p {
		switch {
		case c == ' ' || c == '\t' || c == '\r':
		case c == ':' && s.mode == keyMode:
			s.mode = colonMode
		case c == '{' && s.mode == colonMode:
			if s.buf == nil {
				s.buf = make([]byte, 0, maxUsageObject)
			}
			s.buf = append(s.buf[:0], c)
			s.mode, s.obj, s.str, s.esc = captureMode, 1, false, false
			return p[i+1:]
		default:
			s.mode = scanMode
			return p[i:]
		}
	}
	return nil
}

// object reads a usage object up to its closing brace, into buf unless it
// outgrew it, and decodes it if it was captured whole.
func (s *usageScanner) object(p []byte) []byte {
	for i, c := range p {
		if s.mode == captureMode {
			if len(s.buf) == maxUsageObject {
				s.mode = skipMode
			} else {
				s.buf = append(s.buf, c)
			}
		}
		switch {
		case s.esc:
			s.esc = false
		case s.str:
			s.esc, s.str = c == '\\', c != '"'
		case c == '"':
			s.str = true
		case c == '{' || c == '[':
			s.obj++
		case c == '}' || c == ']':
			if s.obj--; s.obj == 0 {
				if s.mode == captureMode {
					s.decode()
				}
				s.mode = scanMode
				return p[i+1:]
			}
		}
	}
	return nil
}

// decode reads the usage object in buf and keeps the counts it gives, over
// earlier ones: Anthropic's message_delta follows its message_start.
func (s *usageScanner) decode() {
	d := usageDecoder{b: s.buf}
	if !d.object(false) {
		return
	}
	for f := range numUsageFields {
		if d.has&(1<<f) != 0 {
			s.vals[f] = d.vals[f]
		}
	}
	s.has |= d.has
	if d.has&(1<<completionField|1<<outputField) != 0 && !s.startEvent {
		s.final = true
	}
}

// usage returns the usage read so far, and whether it is final: an output
// count was read, and not from Anthropic's message_start, whose output count
// is only the first token's.
func (s *usageScanner) usage() (TokenUsage, bool) {
	var u TokenUsage
	if s.has&(1<<promptField) != 0 {
		u.Input = s.vals[promptField]
	} else {
		u.Input = addTokens(addTokens(s.vals[inputField], s.vals[cacheCreationField]), s.vals[cacheReadField])
	}
	u.Output = s.vals[outputField]
	if s.has&(1<<completionField) != 0 {
		u.Output = s.vals[completionField]
	}
	u.Cached = s.vals[cacheReadField]
	if s.has&(1<<cachedField) != 0 {
		u.Cached = s.vals[cachedField]
	}
	return u, s.final
}

// reset readies s for another body, keeping its buffer for the pool.
func (s *usageScanner) reset() {
	*s = usageScanner{buf: s.buf[:0]}
}
