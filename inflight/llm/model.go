package llm

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// UnknownModel is {http.inflight.model} for a request whose body names no
// model that can be read: never empty, since a limit does not count a
// request whose key is empty, and a client must not escape a cap per model
// by hiding its model.
const UnknownModel = "_unknown"

// isModelName reports whether a request body's top-level key names its
// model: OpenAI chat completions, completions, Responses and embeddings,
// and Anthropic messages all have one. A key is read as the backends read
// it: byte for byte (MODEL is not model), an escaped "mod\u0065l" counting
// as the name it spells (see keyName). A "model" anywhere but at the top
// level (in a message's text, in metadata) is not the request's.
func isModelName(name []byte) bool { return string(name) == "model" }

// modelOf returns the model value names, the raw JSON value of a body's
// last top-level "model" (the one the backends' decoders keep), escapes
// decoded; UnknownModel if there is none (nil), or if it is not a string
// or is empty.
func modelOf(value []byte) string {
	if len(value) <= len(`""`) || value[0] != '"' {
		return UnknownModel
	}
	if bytes.IndexByte(value, '\\') < 0 && utf8.Valid(value) {
		return string(value[1 : len(value)-1])
	}
	var model string
	json.Unmarshal(value, &model) // a valid JSON string: cannot fail; invalid UTF-8 becomes U+FFFD, as backends decode it
	return model
}
