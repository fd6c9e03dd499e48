package inflight

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"
)

// modelPlaceholder holds the model a request's JSON body names.
const modelPlaceholder = "{http.inflight.model}"

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

// readModel reads r's body before the request is admitted when the
// handler needs it, with cost tokens or a template naming
// {http.inflight.model} (readsBody), and sets that placeholder, kept in a
// for the usage its response reports. It reads at most cost tokens'
// max_body, DefaultMaxBody without cost tokens: a longer body's model is
// UnknownModel. The body read is handed on to the next handler byte for
// byte.
func (h *Handler) readModel(r *http.Request, a *admission) (requestBody, error) {
	if !h.readsBody {
		return requestBody{}, nil
	}
	maxBody := int64(DefaultMaxBody)
	if h.CostTokens != nil {
		maxBody = h.CostTokens.MaxBody
	}
	body, err := readBody(r, maxBody)
	if err != nil {
		return body, bodyError(err)
	}
	a.model = body.fields.model
	replacer(r).Set("http.inflight.model", a.model)
	return body, nil
}

// namesModel reports whether one of h's templates names
// {http.inflight.model}, which is then read for every request.
func (h *Handler) namesModel() bool {
	templates := []string{h.Priority, h.Weight, h.Cost, h.Deadline}
	for _, l := range h.Limits {
		templates = append(templates, l.Key, l.Max.Placeholder)
	}
	return slices.ContainsFunc(templates, func(t string) bool { return strings.Contains(t, modelPlaceholder) })
}
