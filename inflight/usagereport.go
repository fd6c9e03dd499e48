package inflight

import (
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-inflight/caddy-inflight/inflight/llm"
)

// serveReporting serves an admitted POST request with cost tokens (model
// APIs are called by POST; a GET may fetch what a client wrote, such as an
// uploaded file, whose text must not count as a model's report): its
// response passes through unchanged while the usage the model reports in
// it is read (llm.Writer), and once it ended, a usage read whole settles
// the request: its fair charge becomes the tokens reported, the zone
// counts them, its output count may teach the learned estimate (see
// llm.Estimate), and the placeholders {http.inflight.usage.*} hold them
// for access logs. When include_usage asked for the report, the stream is
// filtered back to what the client asked for (see
// llm.TokensCost.IncludeUsage), and the event it ended within is passed on
// once next returned.
func (h *Handler) serveReporting(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, a *admission) error {
	if a.usage == nil {
		a.usage = new(llm.Writer) // kept with the pooled admission
	}
	uw := a.usage
	uw.Begin(w, a.tokens)
	err := h.serveNext(uw, r, next, a)
	if u, ok := uw.End(); ok {
		h.meter.Report(&a.ticket, a.model, u, a.tokens)
		setUsage(r, u)
	}
	return err
}

// serveNext runs the rest of the chain, measured with total_adaptive.
func (h *Handler) serveNext(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, a *admission) error {
	if h.TotalAdaptive != nil {
		return h.serveMeasured(w, r, next, &a.measured)
	}
	return next.ServeHTTP(w, r)
}

// setUsage sets the placeholders of the usage a model reported.
func setUsage(r *http.Request, u llm.TokenUsage) {
	repl := replacer(r)
	repl.Set("http.inflight.usage.input_tokens", u.Input)
	repl.Set("http.inflight.usage.output_tokens", u.Output)
	repl.Set("http.inflight.usage.cached_tokens", u.Cached)
}
