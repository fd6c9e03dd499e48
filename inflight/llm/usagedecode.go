package llm

import "math"

// The counts a usage object may give, as indexes of usageScanner.vals.
const (
	promptField        = iota // OpenAI chat prompt_tokens
	completionField           // OpenAI chat completion_tokens
	inputField                // OpenAI Responses and Anthropic input_tokens
	outputField               // OpenAI Responses and Anthropic output_tokens
	cacheCreationField        // Anthropic cache_creation_input_tokens
	cacheReadField            // Anthropic cache_read_input_tokens
	cachedField               // OpenAI {prompt,input}_tokens_details.cached_tokens
	numUsageFields

	detailsField = -2 // an OpenAI *_tokens_details object, read for cached_tokens
	otherField   = -1 // any other key, passed over
)

// usageDecoder reads the counts of one captured usage object, without
// allocating: a few keys of a small object need no general JSON decoder.
type usageDecoder struct {
	b    []byte
	i    int
	vals [numUsageFields]int64
	has  uint16 // bit f: vals[f] was read
}

// usageField names the count a key of a usage object gives, or of its
// *_tokens_details object if details.
func usageField(key []byte, details bool) int {
	if details {
		if string(key) == "cached_tokens" {
			return cachedField
		}
		return otherField
	}
	switch string(key) {
	case "prompt_tokens":
		return promptField
	case "completion_tokens":
		return completionField
	case "input_tokens":
		return inputField
	case "output_tokens":
		return outputField
	case "cache_creation_input_tokens":
		return cacheCreationField
	case "cache_read_input_tokens":
		return cacheReadField
	case "prompt_tokens_details", "input_tokens_details":
		return detailsField
	}
	return otherField
}

// object reads the object at d.i, reporting whether it is well formed: the
// counts of a broken object are not kept.
func (d *usageDecoder) object(details bool) bool {
	d.i++ // the '{'
	if d.ws(); d.peek() == '}' {
		d.i++
		return true
	}
	for {
		d.ws()
		key, ok := d.str()
		if d.ws(); !ok || d.peek() != ':' {
			return false
		}
		d.i++
		d.ws()
		switch f := usageField(key, details); {
		case f >= 0 && (d.peek() == '-' || isDigit(d.peek())):
			d.number(f)
		case f == detailsField && d.peek() == '{':
			ok = d.object(true)
		default:
			ok = d.skip()
		}
		if d.ws(); !ok {
			return false
		}
		switch d.peek() {
		case ',':
			d.i++
		case '}':
			d.i++
			return true
		default:
			return false
		}
	}
}

// number reads the number at d.i as count f if it is a whole number that is
// not negative; a huge one is taken as math.MaxInt64.
func (d *usageDecoder) number(f int) {
	start := d.i
	for d.i < len(d.b) && isNumberByte(d.b[d.i]) {
		d.i++
	}
	var n int64
	for _, c := range d.b[start:d.i] {
		if !isDigit(c) {
			return // negative, fractional or an exponent
		}
		if digit := int64(c - '0'); n > (math.MaxInt64-digit)/10 {
			n = math.MaxInt64
		} else {
			n = n*10 + digit
		}
	}
	d.vals[f] = n
	d.has |= 1 << f
}

// skip passes over the value at d.i, reporting whether there was one.
func (d *usageDecoder) skip() bool {
	switch c := d.peek(); {
	case c == '"':
		_, ok := d.str()
		return ok
	case c == '{' || c == '[':
		for depth := 0; d.i < len(d.b); {
			switch d.b[d.i] {
			case '"':
				if _, ok := d.str(); !ok {
					return false
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					d.i++
					return true
				}
			}
			d.i++
		}
		return false
	}
	start := d.i // a number, true, false or null
	for d.i < len(d.b) && (isNumberByte(d.b[d.i]) || 'a' <= d.b[d.i] && d.b[d.i] <= 'z') {
		d.i++
	}
	return d.i > start
}

// str reads the string at d.i and returns its bytes as written, escapes
// and all: a key with an escape is none of those looked for.
func (d *usageDecoder) str() ([]byte, bool) {
	if d.peek() != '"' {
		return nil, false
	}
	for j := d.i + 1; j < len(d.b); j++ {
		switch d.b[j] {
		case '\\':
			j++
		case '"':
			s := d.b[d.i+1 : j]
			d.i = j + 1
			return s, true
		}
	}
	return nil, false
}

// ws passes over white space.
func (d *usageDecoder) ws() {
	for d.i < len(d.b) && (d.b[d.i] == ' ' || d.b[d.i] == '\t' || d.b[d.i] == '\r' || d.b[d.i] == '\n') {
		d.i++
	}
}

// peek returns the byte at d.i, or 0 at the end.
func (d *usageDecoder) peek() byte {
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

// isDigit reports whether c is a decimal digit.
func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// isNumberByte reports whether c may be part of a JSON number.
func isNumberByte(c byte) bool {
	return isDigit(c) || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
}
