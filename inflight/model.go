package inflight

import (
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-inflight/caddy-inflight/inflight/llm"
)

// modelPlaceholder holds the model a request's JSON body names.
const modelPlaceholder = "{http.inflight.model}"

// readModel reads r's body before the request is admitted when the
// handler needs it, with cost tokens or a template naming
// {http.inflight.model} (readsBody), and sets that placeholder, kept in a
// for the usage its response reports. It reads at most cost tokens'
// max_body, llm.DefaultMaxBody without cost tokens: a longer body's model
// is llm.UnknownModel. The body read is handed on to the next handler byte for
// byte.
func (h *Handler) readModel(r *http.Request, a *admission) (llm.Body, error) {
	if !h.readsBody {
		return llm.Body{}, nil
	}
	maxBody := int64(llm.DefaultMaxBody)
	if h.CostTokens != nil {
		maxBody = h.CostTokens.MaxBody
	}
	body, err := llm.ReadBody(r, maxBody)
	if err != nil {
		return body, bodyError(err)
	}
	a.model = body.Model()
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

// bodyError is the error a request whose body could not be read is
// answered with: the client's doing, 413 over a request_body limit, else
// 499 (it left mid-body).
func bodyError(err error) error {
	if _, tooLarge := errors.AsType[*http.MaxBytesError](err); tooLarge {
		return caddyhttp.Error(http.StatusRequestEntityTooLarge, err)
	}
	return caddyhttp.Error(499, err)
}
