// Package inflight is the Caddy HTTP handler `inflight`: it caps how many
// requests one client, key or tenant may have in flight at once, and refuses
// or queues the one over the cap.
package inflight

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
	"github.com/caddy-inflight/caddy-inflight/inflight/llm"
)

func init() {
	caddy.RegisterModule(new(Handler))
}

// totalName is the limit name the total cap reports as.
const totalName = "total"

// Handler caps the number of requests in flight per key. A request takes one
// slot (or, with Cost, its cost in units) in every limit and the total when
// it enters the handler, or none if any of them has no room, and gives them
// back when the rest of the handler chain has returned: the response fully
// written, streams and upgraded connections included, whether it ended
// normally, with an error or a panic.
//
// A request over a cap is refused at once with `status_code` and
// `Retry-After`, or, with `wait`, queued until a slot frees. On refusal the
// placeholder `{http.inflight.limit}` holds the name of the limit that
// refused (`total` for the total cap), and `{http.inflight.reason}` why
// (full, timeout, queue_full, keys_full, store_error), for use in
// `handle_errors`. A gRPC call is refused with a gRPC status instead (see
// GRPCStatus).
//
// `{http.inflight.model}` is the model an LLM request's JSON body names
// (its top-level "model"), or `_unknown` when none can be read: a key, a
// max, a priority, a weight or a `map` source can use it. The body is read
// for it before the request is admitted, up to CostTokens' MaxBody (1 MiB
// without cost tokens), only with CostTokens or when one of the handler's
// templates names it (see llm.ReadBody).
type Handler struct {
	// Limits, Total, Zone, DryRun, Replicas, Wait, MaxWaiting, Priority,
	// Fair, Weight, MaxWaitingPerKey, MaxKeys, PerKeyMetrics, PlainKeys
	// and Store: the options every protocol shares (see core.Config).
	core.Config

	// TotalAdaptive makes the total cap adaptive instead: it finds the
	// backend's capacity from the latency of the requests it admits (see
	// AdaptiveTotal). With dry_run the limit is computed and exported but
	// not enforced. Not with a shared store.
	TotalAdaptive *AdaptiveTotal `json:"total_adaptive,omitempty"`

	// StatusCode is the status of a refusal, 400-599. Default: 429.
	StatusCode int `json:"status_code,omitempty"`

	// RetryAfter is sent as the Retry-After header of a refusal, rounded up
	// to whole seconds, and to a gRPC client as grpc-retry-pushback-ms.
	// Default: 1s.
	RetryAfter caddy.Duration `json:"retry_after,omitempty"`

	// RetryAfterMs, if set, sends a refusal's retry-after-ms header beside
	// Retry-After (which stays whole seconds, as HTTP requires): the
	// OpenAI and Anthropic SDKs read it first. A duration (250ms) sends
	// that; `auto` tells each refused request when a slot should be free
	// for it: the requests waiting in the zone, plus one, times the time
	// between freed slots (the zone's recent rate, as early_refusal reads
	// it), and one such time after the previous refusal's, so that refused
	// clients come back one after another, jittered by ±10 %, between 10 ms
	// and retry_after; until the zone has seen 4 releases, none is sent.
	// With a shared store the rate and the waiting are this instance's.
	// Default: not sent.
	RetryAfterMs string `json:"retry_after_ms,omitempty"`

	// GRPCStatus is the gRPC status of a refused gRPC or gRPC-Web request
	// (Content-Type application/grpc, application/grpc-web and their
	// +codec forms): `resource_exhausted` (code 8) or `unavailable` (code
	// 14). Such a refusal is a Trailers-Only response, HTTP 200 with
	// grpc-status, grpc-message (the limit and reason) and
	// grpc-retry-pushback-ms (RetryAfter) in its header block, written by
	// the handler itself: StatusCode and handle_errors do not apply, as no
	// gRPC client reads an HTTP error. Default: resource_exhausted.
	GRPCStatus string `json:"grpc_status,omitempty"`

	// WaitBodyBuffer bounds, in bytes, how much of a waiting HTTP/1.x
	// request's body is read ahead while it waits, so that the server
	// notices its client leaving; the body reaches the next handler
	// unchanged. A longer body is read up to the bound only, and a client
	// that leaves while more of it is unsent is noticed when its wait ends.
	// Default: 65536 (64 KiB).
	WaitBodyBuffer int `json:"wait_body_buffer,omitempty"`

	// Deadline is a placeholder giving, per request, how long its client
	// still waits for an answer, such as {header.X-Request-Timeout} set by
	// a proxy the operator trusts: a positive Go duration (300ms, 1.5s) or
	// number of seconds (0.3). The request's wait then ends a margin
	// before that deadline (min(wait, deadline − margin), the margin 10 %
	// of the deadline, at most 50 ms), so that it is refused while its
	// client still listens, never admitted after the client gave up. A
	// request with no room and less time left than the margin is refused
	// at once. A value that is neither is ignored, logged once per value;
	// an empty one means no deadline. A fixed value must be a deadline.
	// gRPC requests (Content-Type application/grpc*) are bounded by their
	// grpc-timeout the same way, with or without Deadline (the shorter
	// wins); a malformed grpc-timeout is ignored. The deadline counts from
	// when the request reaches this handler. Only with wait.
	Deadline string `json:"deadline,omitempty"`

	// EarlyRefusal refuses a request with a deadline (Deadline, or a
	// gRPC grpc-timeout) at once, reason `timeout`, when its wait is
	// expected to run out anyway: when the requests already waiting in the
	// zone, plus this one, divided by the zone's recent rate of freed
	// slots (releases per second, exponentially weighted over about 3 s),
	// exceed the wait its deadline allows by more than a quarter. No
	// request is refused early before the zone has seen 4 releases. Off by
	// default. The prediction
	// counts every waiter of the zone as ahead (priority and fair order,
	// and waiters blocked by other keys, are not modelled), and uses this
	// process's queue only (not a shared store's).
	EarlyRefusal bool `json:"early_refusal,omitempty"`

	// Cost is how many units a request takes from every limit and the
	// total: a positive integer, or a placeholder that resolves to one per
	// request (such as a header set by an authenticating handler before
	// this one, or a `map` output). With it, every max and the total count
	// units, not requests: `limit tenant {tenant} 32000` with a cost in
	// tokens means 32,000 tokens in flight per tenant. A cost above a cap
	// counts as that cap: the request is admitted alone once the cap is
	// free. A value that does not resolve to a positive integer is
	// answered with 500, logged once per value. `{http.inflight.cost}`
	// holds the request's cost. Default: 1. It must not come from a value
	// the client chooses: a client that declares a small cost takes more
	// than its share.
	Cost string `json:"cost,omitempty"`

	// CostTokens estimates each request's cost in tokens from its body,
	// for OpenAI- and Anthropic-style JSON APIs (see llm.TokensCost); not with
	// Cost. A body that cannot be read (the client left) is answered with
	// 499 and takes nothing.
	CostTokens *llm.TokensCost `json:"cost_tokens,omitempty"`

	// LimitHeaders names the limits (and `total`) whose level each client
	// sees, on admitted responses and refusals alike, in the fields of the
	// IETF draft "RateLimit header fields for HTTP": `RateLimit-Policy`
	// gives each named limit's cap for the request's key as its quota `q`
	// (the max, or the request's own from a placeholder, split by
	// replicas; `qu="concurrent-requests"`, left out with a cost, whose
	// units the draft has no name for), and `RateLimit` the units the
	// key has left as `r` (the cap less the units its requests hold, this
	// one included once admitted; never below 0); one list member per
	// limit, named after the limit, without its key. A request whose key
	// for a limit is empty gets no member for it. With a shared store the
	// level is the fleet's: the cap, not split by replicas, and the units
	// held across the fleet, as the store answered the call that decided
	// the request; while the store cannot answer and fails open, this
	// instance's share and units, marked `inflight-scope="instance"`.
	// Default: none.
	LimitHeaders []string `json:"limit_headers,omitempty"`

	logger     *zap.Logger
	gate       *core.Gate
	meter      *llm.Meter // with costs; estimates with cost tokens
	keys       []valueFunc
	maxes      []valueFunc // nil where the max is fixed
	priority   valueFunc
	weight     valueFunc                          // nil without fair
	deadline   valueFunc                          // nil without Deadline
	cost       func(*http.Request) (int64, error) // nil: every request costs 1
	waits      bool                               // requests may wait
	readsBody  bool                               // with cost tokens or {http.inflight.model}: the body is read before admission
	retryAfter string
	retryMs    string         // a fixed retry-after-ms; "" with none or auto
	retryAuto  bool           // retry-after-ms auto
	levels     []int          // dimensions of LimitHeaders; nil: none
	shared     bool           // a store keeps the counts: levels are the fleet's
	badValues  core.BadValues // of the max and cost placeholders
	admissions sync.Pool
}

// CaddyModule returns the Caddy module information.
func (*Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.inflight",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets defaults, compiles the placeholders and joins the zone.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	h.setDefaults()
	if err := h.checkAdaptive(); err != nil {
		return fmt.Errorf("inflight: %w", err)
	}
	if err := h.compileCost(); err != nil {
		return fmt.Errorf("inflight: %w", err)
	}
	if err := h.compileLimitHeaders(); err != nil {
		return fmt.Errorf("inflight: %w", err)
	}
	if err := h.compileDeadline(); err != nil {
		return fmt.Errorf("inflight: %w", err)
	}
	if err := h.compileRetryAfterMs(); err != nil {
		return fmt.Errorf("inflight: %w", err)
	}
	edge := core.Edge{Site: siteOf(ctx), Noun: "request", AddressKeys: addressKeys, UnitMax: true, Costs: h.costed(), Show: ShortForm, EarlyRefusal: h.EarlyRefusal, RetryHints: h.retryAuto, Metrics: llm.Collectors()}
	if at := h.TotalAdaptive; at != nil {
		cfg := at.config()
		edge.Adaptive = &cfg
	}
	var err error
	if h.gate, err = core.Join(ctx, &h.Config, edge); err != nil {
		return err
	}
	if h.costed() {
		h.meter = llm.Join(h.gate, h.CostTokens)
	}
	h.compile()
	return nil
}

// Validate checks the values Provision does not need.
func (h *Handler) Validate() error {
	switch {
	case h.StatusCode < 400 || h.StatusCode > 599:
		return fmt.Errorf("inflight: status_code %d is not allowed: want 400-599", h.StatusCode)
	case h.RetryAfter < 0:
		return fmt.Errorf("inflight: retry_after %s is not allowed: want a positive duration", time.Duration(h.RetryAfter))
	case h.WaitBodyBuffer < 0:
		return fmt.Errorf("inflight: wait_body_buffer %d is not allowed: want a positive number of bytes", h.WaitBodyBuffer)
	}
	if err := CheckGRPCStatus(h.GRPCStatus); err != nil {
		return fmt.Errorf("inflight: %w", err)
	}
	return nil
}

// ServeHTTP admits the request into every limit or refuses it, and holds its
// slots until the rest of the chain has returned.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	a := h.admissions.Get().(*admission)
	defer h.recycle(a) // deferred first, so it runs after the release
	t := &a.ticket

	body, err := h.readModel(r, a)
	if err != nil {
		return err
	}
	for i, key := range h.keys {
		t.Req.Keys[i] = key(r)
		if h.maxes[i] == nil || t.Req.Keys[i] == "" {
			continue
		}
		max, err := h.resolveMax(i, r)
		if err != nil {
			return err
		}
		t.Req.Max[i] = max
	}
	if h.costed() {
		cost, err := h.costOf(r, a, &body)
		if err != nil {
			return err
		}
		t.Req.Cost = cost
		replacer(r).Set("http.inflight.cost", cost)
	}
	var class, weight string
	if h.priority != nil {
		class = h.priority(r)
	}
	if h.weight != nil {
		weight = h.weight(r)
	}
	if h.waits && mustWatchBody(r) {
		a.watch.r, a.watch.limit = r, h.WaitBodyBuffer
	}

	v := h.admit(r, t, class, weight)
	h.sendLevels(w, a, v.Result)
	if wb := a.watch.body; wb != nil { // it waited: its body was read ahead
		wb.stop.Store(true)
		defer wb.end(w)
		if v.Outcome == limiter.Admitted {
			r.Body = wb
		}
	}
	switch {
	case v.Outcome == limiter.Admitted:
		defer h.gate.Release(t)
	case v.Outcome == limiter.Aborted:
		// The client left while waiting: nobody reads a response.
		return caddyhttp.Error(499, r.Context().Err())
	case v.Reason == core.ReasonDryRun:
	default:
		return h.refuse(w, r, v)
	}
	if h.CostTokens != nil && r.Method == http.MethodPost {
		return h.serveReporting(w, r, next, a)
	}
	return h.serveNext(w, r, next, a)
}

// Cleanup leaves the zone; requests still in flight release into it safely,
// and its waiters move to the limits of the config that replaced this one.
func (h *Handler) Cleanup() error {
	if h.gate == nil {
		return nil
	}
	return h.gate.Leave()
}

// DefaultRetryAfter is RetryAfter's default.
const DefaultRetryAfter = time.Second

func (h *Handler) setDefaults() {
	if h.StatusCode == 0 {
		h.StatusCode = http.StatusTooManyRequests
	}
	if h.RetryAfter == 0 {
		h.RetryAfter = caddy.Duration(DefaultRetryAfter)
	}
	if h.WaitBodyBuffer == 0 {
		h.WaitBodyBuffer = DefaultWaitBodyBuffer
	}
	for i := range h.Limits {
		if h.Limits[i].Key == "" {
			h.Limits[i].Key = DefaultKey
		}
	}
}

// compile turns the placeholders into functions the request path calls.
func (h *Handler) compile() {
	h.keys = make([]valueFunc, len(h.Limits))
	h.maxes = make([]valueFunc, len(h.Limits))
	for i, l := range h.Limits {
		h.keys[i] = compileKey(l.Key)
		if l.Max.Placeholder != "" {
			h.maxes[i] = compileTemplate(l.Max.Placeholder)
		}
	}
	if h.Priority != "" {
		h.priority = compileTemplate(h.Priority)
	}
	if h.Fair != "" && h.Weight != "" {
		h.weight = compileTemplate(h.Weight)
	}
	h.readsBody = h.CostTokens != nil || h.namesModel()
	h.waits = h.Wait > 0 && !h.DryRun
	if h.Deadline != "" && h.waits {
		h.deadline = compileTemplate(h.Deadline)
	}
	h.retryAfter = strconv.Itoa(int(math.Ceil(time.Duration(h.RetryAfter).Seconds())))
	g := h.gate
	h.admissions.New = func() any {
		a := new(admission)
		g.InitTicket(&a.ticket)
		a.ticket.OnQueued = a.watchBody
		return a
	}
}

// refuse answers a request over its cap with the configured status and
// Retry-After, as a Caddy error so that handle_errors routes run; a gRPC
// request with a gRPC status instead (refuseGRPC).
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, v core.Verdict) error {
	replacer(r).Set("http.inflight.limit", v.Limit)
	replacer(r).Set("http.inflight.reason", v.Reason)
	if ct := grpcContentType(r); ct != "" {
		h.refuseGRPC(w, ct, v)
		return nil
	}
	w.Header().Set("Retry-After", h.retryAfter)
	h.setRetryAfterMs(w)
	return caddyhttp.Error(h.StatusCode, fmt.Errorf("inflight: limit %s refused the request (%s)", v.Limit, v.Reason))
}

// resolveMax evaluates limit i's placeholder max. A value that is not a
// positive integer is a configuration error on the operator's side: 500,
// logged once per distinct value.
func (h *Handler) resolveMax(i int, r *http.Request) (int64, error) {
	v := h.maxes[i](r)
	n, err := strconv.ParseInt(v, 10, 64)
	if err == nil && n > 0 {
		return n, nil
	}
	seen := h.badValues.Log("max", v, func(seen string) {
		h.logger.Error("max placeholder did not resolve to a positive integer; answering 500",
			zap.String("limit", h.Limits[i].Name), zap.String("max", h.Limits[i].Max.Placeholder), zap.String("value", seen))
	})
	return 0, caddyhttp.Error(http.StatusInternalServerError,
		fmt.Errorf("inflight: limit %s: max %s resolved to a value that is not a positive integer (%s)", h.Limits[i].Name, h.Limits[i].Max.Placeholder, seen))
}

// admission is the per-request state, pooled so that admitting a request
// allocates nothing.
type admission struct {
	ticket core.Ticket
	watch  bodyWatch
	// measured wraps the response writer, with total_adaptive.
	measured measuredWriter
	// model is {http.inflight.model}, when the body is read; tokens is
	// the request's estimate, and usage reads the usage its response
	// reports (made at its first use), with cost tokens.
	model  string
	tokens llm.Estimate
	usage  *llm.Writer
	// Fill a 384-byte size class, whose objects start on cache lines:
	// requests admitted on different cores then never write one line.
	_ [384 - unsafe.Sizeof(core.Ticket{}) - unsafe.Sizeof(bodyWatch{}) - unsafe.Sizeof(measuredWriter{}) - unsafe.Sizeof("") - unsafe.Sizeof(llm.Estimate{}) - unsafe.Sizeof(&llm.Writer{})]byte
}

// watchBody runs when a's request is queued: its client is watched while
// it waits if its body must be read for that.
func (a *admission) watchBody() {
	if a.watch.r != nil {
		a.watch.start()
	}
}

// recycle returns a to the pool without the request's keys, which must not
// stay reachable after it ends.
func (h *Handler) recycle(a *admission) {
	a.ticket.Reset()
	a.watch.r, a.watch.body = nil, nil
	a.measured = measuredWriter{}
	a.model, a.tokens = "", llm.Estimate{}
	if a.usage != nil {
		a.usage.Reset()
	}
	h.admissions.Put(a)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
