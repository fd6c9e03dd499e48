// Package inflight is the Caddy HTTP handler `inflight`: it caps how many
// requests one client, key or tenant may have in flight at once, and refuses
// or queues the one over the cap.
package inflight

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

func init() {
	caddy.RegisterModule(new(Handler))
}

// totalName is the limit name the total cap reports as.
const totalName = "total"

// RefusedEvent is the name of the Caddy event emitted for every refusal.
const RefusedEvent = "inflight_refused"

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
// `handle_errors`.
type Handler struct {
	// Limits are the dimensions a request must fit in, all of them, to be
	// admitted: per client IP, per API key, per tenant, and so on.
	Limits []Limit `json:"limits,omitempty"`

	// Total caps the requests in flight through this handler (its zone)
	// across all keys, up to 2^40-1. 0 means no total cap.
	Total int `json:"total,omitempty"`

	// TotalAdaptive makes the total cap adaptive instead: it finds the
	// backend's capacity from the latency of the requests it admits (see
	// AdaptiveTotal). With dry_run the limit is computed and exported but
	// not enforced. Not with a shared store.
	TotalAdaptive *AdaptiveTotal `json:"total_adaptive,omitempty"`

	// Zone names the counters: handlers with the same zone share them,
	// across sites and routes, and must have the same limits (names and
	// keys). A handler without a zone has counters of its own, in a zone
	// named after its site and its position among the site's unnamed
	// inflight handlers (`example.com#1`; the listen address for a site
	// without hosts), which is what metrics and the admin API show. Counts
	// carry over a reload either way, as long as the zone's name and limits
	// stay the same. A name may not contain `#`.
	Zone string `json:"zone,omitempty"`

	// StatusCode is the status of a refusal, 400-599. Default: 429.
	StatusCode int `json:"status_code,omitempty"`

	// RetryAfter is sent as the Retry-After header of a refusal, rounded up
	// to whole seconds. Default: 1s.
	RetryAfter caddy.Duration `json:"retry_after,omitempty"`

	// DryRun counts and reports everything as if enforced (refusals appear
	// in metrics with reason `dry_run`, and in logs) but lets every request
	// through; a request that would be refused takes no slot.
	DryRun bool `json:"dry_run,omitempty"`

	// Replicas is the number of Caddy instances sharing the load: each
	// enforces ceil(max/replicas) of every limit and of the total. Default: 1.
	Replicas int `json:"replicas,omitempty"`

	// Wait is how long a request over a cap may wait for a slot before it is
	// refused with reason `timeout`. 0 (the default) refuses at once.
	Wait caddy.Duration `json:"wait,omitempty"`

	// MaxWaiting bounds the requests waiting in this handler's zone; one
	// more is refused at once with reason `queue_full`. Default with `wait`:
	// 1000.
	MaxWaiting int `json:"max_waiting,omitempty"`

	// Priority is a placeholder template giving each waiting request its
	// class: `high`, `normal` or `low` (a value that is none of them counts
	// as normal; a fixed one must be one of them). When a slot
	// frees, the waiter with the highest weight × (1 + seconds waited / 30)
	// goes first, with weights high 2, normal 1, low 0.5. With Fair, the
	// class weight is also the key's default share. It must come from
	// something the operator controls (a map of an authenticated identity):
	// a client that chooses its class makes itself high.
	Priority string `json:"priority,omitempty"`

	// Fair names the limit whose keys share the slots fairly while requests
	// wait: a freed slot goes to the waiting key that has been granted the
	// fewest slots relative to its weight, so each key with waiters gets its
	// weighted share of the cap however many requests it queues, and a key
	// that arrives behind a flood is served at the next freed slot its share
	// calls for. Without it, the queue order is the priority score alone.
	// The limit's key should be an authenticated identity: a client that
	// can invent keys gets a share for each.
	Fair string `json:"fair,omitempty"`

	// Weight is a placeholder template giving a key's share under Fair: a
	// positive number from 0.001 to 1000 (2 gets twice the slots of 1).
	// Default: the request's priority class weight (high 2, normal 1, low
	// 0.5). A value outside the range counts as the nearest bound, and one
	// that is not a positive number as 1; each is logged once per value. A
	// fixed weight (no placeholder) outside the range is refused at load.
	// It must come from something the operator controls (a map of an
	// authenticated identity), never from a value the client chooses.
	Weight string `json:"weight,omitempty"`

	// MaxWaitingPerKey bounds the requests waiting with one key (of the Fair
	// limit, or else of the first limit); one more is refused at once with
	// reason `queue_full`. 0 (the default) means no bound besides
	// MaxWaiting.
	MaxWaitingPerKey int `json:"max_waiting_per_key,omitempty"`

	// MaxKeys bounds the keys each limit of the zone holds at once, so that
	// a flood of distinct keys cannot grow memory without end: a request
	// with a key not yet in flight is refused (reason `keys_full`) once the
	// bound is reached, exactly: while MaxKeys keys of that limit are in
	// flight. Requests of keys already in flight are unaffected. 0 means no
	// bound. With a shared store it bounds the keys this instance holds.
	MaxKeys int `json:"max_keys,omitempty"`

	// PerKeyMetrics exports `caddy_inflight_key_requests{zone,limit,key}`,
	// one series per key in flight, the key as a short SHA-256 hash (its
	// raw value with PlainKeys), `caddy_inflight_key_waiting` and the
	// histogram `caddy_inflight_key_wait_seconds{zone,limit,key,outcome}`
	// of the time each key's requests waited. A key's requests series is
	// removed when its count reaches zero, its wait series when it has held
	// no slot, had no waiter and ended no wait for 5 minutes; beyond 1000
	// keys per zone the rest are counted under key `_overflow`. Off by
	// default.
	PerKeyMetrics bool `json:"per_key_metrics,omitempty"`

	// StoreRaw keeps the counts in a store shared by a fleet of Caddy
	// instances, so one cap holds across all of them; `replicas` then only
	// divides the caps each instance enforces alone while the store is
	// unreachable. Module namespace: `http.handlers.inflight.stores`
	// (`redis`). Default: counts in this process.
	StoreRaw json.RawMessage `json:"store,omitempty" caddy:"namespace=http.handlers.inflight.stores inline_key=type"`

	// WaitBodyBuffer bounds, in bytes, how much of a waiting HTTP/1.x
	// request's body is read ahead while it waits, so that the server
	// notices its client leaving; the body reaches the next handler
	// unchanged. A longer body is read up to the bound only, and a client
	// that leaves while more of it is unsent is noticed when its wait ends.
	// Default: 65536 (64 KiB).
	WaitBodyBuffer int `json:"wait_body_buffer,omitempty"`

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
	// for OpenAI- and Anthropic-style JSON APIs (see TokensCost); not with
	// Cost. A body that cannot be read (the client left) is answered with
	// 499 and takes nothing.
	CostTokens *TokensCost `json:"cost_tokens,omitempty"`

	// PlainKeys shows raw keys instead of hashes in per-key metrics and in
	// the admin API. Keys may be secrets (API keys, cookies): turn this on
	// only where metrics are private.
	PlainKeys bool `json:"plain_keys,omitempty"`

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
	// for a limit is empty gets no member for it. With a shared store
	// nothing is sent: this instance's counts are not the fleet's.
	// Default: none.
	LimitHeaders []string `json:"limit_headers,omitempty"`

	ctx        caddy.Context
	logger     *zap.Logger
	events     *caddyevents.App
	zone       *zone
	zoneID     string
	label      string // the zone's name: Zone, or the automatic one
	store      Store
	limits     *limiter.Limits
	adaptive   *limiter.Adaptive // the zone's, with total_adaptive
	keys       []valueFunc
	maxes      []valueFunc // nil where the max is fixed
	priority   valueFunc
	weight     valueFunc                          // nil without fair
	cost       func(*http.Request) (int64, error) // nil: every request costs 1
	retryAfter string
	waitOpt    limiter.WaitOptions
	rejected   map[string][]prometheus.Counter // reason -> per dimension, total last
	waited     [limiter.Aborted + 1]prometheus.Observer
	costs      costObserver
	levels     []int // dimensions of LimitHeaders; nil: none, or a shared store
	admissions sync.Pool
	badValues  sync.Map // bad placeholder values already logged
	badLogs    atomic.Int32
	refusedLog string // the debug line of a refusal
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
	h.ctx = ctx
	h.logger = ctx.Logger()
	h.setDefaults()
	if err := checkLimits(h.Limits); err != nil {
		return fmt.Errorf("inflight: %w", err)
	}
	if err := h.checkAdaptive(); err != nil {
		return fmt.Errorf("inflight: %w", err)
	}
	h.compile()
	if err := h.compileFair(); err != nil {
		return fmt.Errorf("inflight: %w", err)
	}
	if err := h.compileCost(); err != nil {
		return fmt.Errorf("inflight: %w", err)
	}
	if err := h.compileLimitHeaders(); err != nil {
		return fmt.Errorf("inflight: %w", err)
	}

	eventsApp, err := ctx.App("events")
	if err != nil {
		return fmt.Errorf("inflight: getting events app: %v", err)
	}
	h.events = eventsApp.(*caddyevents.App)
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("inflight: registering metrics: %v", err)
	}
	if err := h.joinZone(ctx); err != nil {
		return err
	}
	h.joinAdaptive()
	h.initMetrics()
	h.zone.keyDisplay.Store(h.keyDisplay())
	h.zone.view.Store(h.view())
	h.zone.Adopt(h.limits)
	return nil
}

// Validate checks the values Provision does not need.
func (h *Handler) Validate() error {
	switch {
	case len(h.Limits) == 0 && h.Total == 0 && h.TotalAdaptive == nil:
		return fmt.Errorf("inflight: no limit: give a max (inflight 20), a limit or a total")
	case h.Total < 0 || h.Total > limiter.MaxCost:
		return fmt.Errorf("inflight: total %d is not allowed: want %s (0 for none)", h.Total, CapRange)
	case h.StatusCode < 400 || h.StatusCode > 599:
		return fmt.Errorf("inflight: status_code %d is not allowed: want 400-599", h.StatusCode)
	case h.RetryAfter < 0:
		return fmt.Errorf("inflight: retry_after %s is not allowed: want a positive duration", time.Duration(h.RetryAfter))
	case h.Replicas < 1:
		return fmt.Errorf("inflight: replicas %d is not allowed: want a positive integer", h.Replicas)
	case h.Wait < 0:
		return fmt.Errorf("inflight: wait %s is not allowed: want a positive duration (0 refuses at once)", time.Duration(h.Wait))
	case h.MaxWaiting < 0:
		return fmt.Errorf("inflight: max_waiting %d is not allowed: want a positive integer", h.MaxWaiting)
	case strings.Contains(h.Zone, "#"):
		return fmt.Errorf("inflight: zone %q is not allowed: '#' marks the automatic names of unnamed zones; choose a name without it", h.Zone)
	case h.WaitBodyBuffer < 0:
		return fmt.Errorf("inflight: wait_body_buffer %d is not allowed: want a positive number of bytes", h.WaitBodyBuffer)
	case h.MaxKeys < 0:
		return fmt.Errorf("inflight: max_keys %d is not allowed: want a positive integer (0 for none)", h.MaxKeys)
	}
	if err := CheckPriority(h.Priority); err != nil {
		return fmt.Errorf("inflight: %w", err)
	}
	h.warnIneffective()
	return nil
}

// ServeHTTP admits the request into every limit or refuses it, and holds its
// slots until the rest of the chain has returned.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	a := h.admissions.Get().(*admission)
	defer h.recycle(a) // deferred first, so it runs after the release

	for i, key := range h.keys {
		a.req.Keys[i] = key(r)
		if h.maxes[i] == nil || a.req.Keys[i] == "" {
			continue
		}
		max, err := h.resolveMax(i, r)
		if err != nil {
			return err
		}
		a.req.Max[i] = max
	}
	a.req.Limits = h.limits
	if h.cost != nil {
		cost, err := h.cost(r)
		if err != nil {
			return err
		}
		a.req.Cost = cost
		replacer(r).Set("http.inflight.cost", cost)
	}
	opt := h.waitOpt
	if h.priority != nil {
		opt.Class = limiter.ParseClass(h.priority(r))
	}
	if h.weight != nil {
		opt.Weight = h.resolveWeight(r)
	}

	if opt.Wait > 0 {
		a.waiting.zone, opt.Queued = &h.zone.units, a.onQueued
		if mustWatchBody(r) {
			a.watch.r, a.watch.limit = r, h.WaitBodyBuffer
		}
	}

	res := h.store.Acquire(r.Context(), &a.req, opt)
	a.waiting.end()
	h.sendLevels(w, a, res)
	if wb := a.watch.body; wb != nil { // it waited: its body was read ahead
		wb.stop.Store(true)
		defer wb.end(w)
		if res.Outcome == limiter.Admitted {
			r.Body = wb
		}
	}
	if o := res.Outcome; (o == limiter.Admitted && res.Waited > 0) || o == limiter.Timeout || o == limiter.Aborted {
		h.waited[o].Observe(res.Waited.Seconds())
		if h.PerKeyMetrics {
			h.zone.series.waited(h, a, o, res.Waited, time.Now())
		}
	}
	switch {
	case res.Outcome == limiter.Admitted:
		defer h.store.Release(&a.req)
		if h.cost != nil {
			h.costs.observe(a.req.Units())
		}
		if h.PerKeyMetrics {
			h.zone.series.admit(h, a)
			defer h.zone.series.release(h, a)
		}
	case res.Outcome == limiter.Aborted:
		// The client left while waiting: nobody reads a response.
		return caddyhttp.Error(499, r.Context().Err())
	case h.DryRun:
		h.report(a, res, reasonDryRun)
	default:
		return h.refuse(w, r, a, res)
	}
	if h.adaptive != nil {
		return h.serveMeasured(w, r, next, &a.measured)
	}
	return next.ServeHTTP(w, r)
}

// Cleanup leaves the zone; requests still in flight release into it safely,
// and its waiters move to the limits of the config that replaced this one.
func (h *Handler) Cleanup() error {
	if h.zone == nil {
		return nil
	}
	h.zone.Retire(h.limits)
	if h.adaptive != nil {
		h.zone.adaptive.leave()
	}
	_, err := zones.Delete(h.zoneID)
	return err
}

func (h *Handler) setDefaults() {
	if h.StatusCode == 0 {
		h.StatusCode = http.StatusTooManyRequests
	}
	if h.refusedLog == "" {
		h.refusedLog = "request refused"
	}
	if h.RetryAfter == 0 {
		h.RetryAfter = caddy.Duration(time.Second)
	}
	if h.Replicas == 0 {
		h.Replicas = 1
	}
	if h.Wait > 0 && h.MaxWaiting == 0 {
		h.MaxWaiting = 1000
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

// compile turns the config into what the request path reads: the limits
// the zone applies, and the placeholders as functions.
func (h *Handler) compile() {
	h.limits = &limiter.Limits{
		Max:     make([]int64, len(h.Limits)),
		Total:   int64(h.Total),
		MaxKeys: int64(h.MaxKeys),
		Divisor: int64(h.Replicas),
	}
	h.keys = make([]valueFunc, len(h.Limits))
	h.maxes = make([]valueFunc, len(h.Limits))
	for i, l := range h.Limits {
		h.keys[i] = compileKey(l.Key)
		if l.Max.Placeholder != "" {
			h.maxes[i] = compileTemplate(l.Max.Placeholder)
		} else {
			h.limits.Max[i] = l.Max.Fixed
		}
	}
	if h.Priority != "" {
		h.priority = compileTemplate(h.Priority)
	}
	h.retryAfter = strconv.Itoa(int(math.Ceil(time.Duration(h.RetryAfter).Seconds())))
	if !h.DryRun {
		h.waitOpt = limiter.WaitOptions{Wait: time.Duration(h.Wait), MaxWaiting: h.MaxWaiting}
	}
	n := len(h.Limits)
	h.admissions.New = func() any { return newAdmission(n) }
}

// joinZone takes a reference to the handler's zone, shared with other
// handlers and config generations, and binds the shared store if any.
func (h *Handler) joinZone(ctx caddy.Context) error {
	hasTotal := h.Total > 0 || h.TotalAdaptive != nil
	switch {
	case h.Zone != "":
		h.label = h.Zone
	case h.label == "": // a gate names its unnamed zones itself
		h.label = autoZone(ctx)
	}
	h.zoneID = zoneID(h.label, h.Zone != "", h.Limits, hasTotal)
	if err := claimZone(ctx.GetMetricsRegistry(), h.Zone, h.zoneID, describeShape(h.Limits, hasTotal)); err != nil {
		return fmt.Errorf("inflight: %w", err)
	}
	z, err := loadZone(h.zoneID, h.label, h.Limits, hasTotal)
	if err != nil {
		return fmt.Errorf("inflight: zone %q: %v", h.label, err)
	}
	h.zone, h.store = z, z.Zone
	if h.StoreRaw == nil {
		return nil
	}
	mod, err := ctx.LoadModule(h, "StoreRaw")
	if err != nil {
		return fmt.Errorf("inflight: loading store: %v", err)
	}
	h.store = mod.(SharedStore).Bind(fleetID(h.label, h.zoneID), names(h.Limits), hasTotal, z.Zone)
	return nil
}

// refuse answers a request over its cap with the configured status and
// Retry-After, as a Caddy error so that handle_errors routes run.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, a *admission, res limiter.Result) error {
	reason := reasonFor(res.Outcome)
	name := h.report(a, res, reason)
	replacer(r).Set("http.inflight.limit", name)
	replacer(r).Set("http.inflight.reason", reason)
	w.Header().Set("Retry-After", h.retryAfter)
	return caddyhttp.Error(h.StatusCode, fmt.Errorf("inflight: limit %s refused the request (%s)", name, reason))
}

// report counts, logs and emits a refusal, and returns the refusing limit's
// name. Keys appear only as hashes, except client addresses in debug logs.
func (h *Handler) report(a *admission, res limiter.Result, reason string) string {
	name, key := totalName, ""
	if res.Dim != limiter.TotalDim {
		name, key = h.Limits[res.Dim].Name, a.req.Keys[res.Dim]
	}
	h.rejected[reason][h.dimIndex(res.Dim)].Inc()
	// Hash the key only for a log line or an event someone will see: under
	// overload every refused request passes here.
	if ce := h.logger.Check(zapcore.DebugLevel, h.refusedLog); ce != nil {
		shown := key
		if key != "" && !keyIsAddress(h.Limits[res.Dim].Key) {
			shown = redact(key)
		}
		ce.Write(zap.String("zone", h.label), zap.String("limit", name), zap.String("key", shown), zap.String("reason", reason))
	}
	if h.events.ShouldEmit(RefusedEvent) {
		hashed := ""
		if key != "" {
			hashed = redact(key)
		}
		h.events.Emit(h.ctx, RefusedEvent, map[string]any{"zone": h.label, "limit": name, "key": hashed, "reason": reason})
	}
	return name
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
	seen := h.logBadValue("max", v, func(seen string) {
		h.logger.Error("max placeholder did not resolve to a positive integer; answering 500",
			zap.String("limit", h.Limits[i].Name), zap.String("max", h.Limits[i].Max.Placeholder), zap.String("value", seen))
	})
	return 0, caddyhttp.Error(http.StatusInternalServerError,
		fmt.Errorf("inflight: limit %s: max %s resolved to a value that is not a positive integer (%s)", h.Limits[i].Name, h.Limits[i].Max.Placeholder, seen))
}

// logBadValue calls log once per distinct bad value of a placeholder
// (kind: max, weight), for the first 1000 values, and returns the value as
// logs show it. The value may come from a client (a header): only its hash
// is shown.
func (h *Handler) logBadValue(kind, v string, log func(seen string)) string {
	seen := redact(v)
	if v == "" {
		seen = "empty"
	}
	if h.badLogs.Load() < 1000 {
		if _, logged := h.badValues.LoadOrStore(kind+" "+seen, true); !logged {
			h.badLogs.Add(1)
			log(seen)
		}
	}
	return seen
}

// dimIndex maps a result's dimension to the index of its metric children,
// the total last.
func (h *Handler) dimIndex(d int) int {
	if d == limiter.TotalDim {
		return len(h.Limits)
	}
	return d
}

func (h *Handler) initMetrics() {
	h.rejected = map[string][]prometheus.Counter{}
	for _, reason := range reasons {
		cs := make([]prometheus.Counter, 0, len(h.Limits)+1)
		for _, l := range h.Limits {
			cs = append(cs, rejectedTotal.WithLabelValues(h.label, l.Name, reason))
		}
		h.rejected[reason] = append(cs, rejectedTotal.WithLabelValues(h.label, totalName, reason))
	}
	h.zone.startStats()
	for _, o := range waitOutcomes {
		h.waited[o] = teeObserver{waitSeconds.WithLabelValues(h.label, outcomeLabel(o)), &h.zone.stats.waits}
	}
	if h.cost != nil {
		h.costs = costObserver{requestCost.WithLabelValues(h.label), &h.zone.units}
	}
}

// admission is the per-request state, pooled so that admitting a request
// allocates nothing.
type admission struct {
	req    limiter.Request
	labels []string // per-key metric labels, when enabled
	watch  bodyWatch
	// measured wraps the response writer, with total_adaptive.
	measured measuredWriter
	waiting  waitUnits
	onQueued func() // queued, bound once so that passing it allocates nothing
	// Fill a 320-byte size class, whose objects start on cache lines:
	// requests admitted on different cores then never write one line.
	_ [320 - unsafe.Sizeof(limiter.Request{}) - unsafe.Sizeof([]string(nil)) - unsafe.Sizeof(bodyWatch{}) - unsafe.Sizeof(measuredWriter{}) - unsafe.Sizeof(waitUnits{}) - unsafe.Sizeof(func() {})]byte
}

func newAdmission(dims int) *admission {
	a := &admission{
		req:    limiter.Request{Keys: make([]string, dims), Max: make([]int64, dims)},
		labels: make([]string, dims),
	}
	a.onQueued = a.queued
	return a
}

// recycle returns a to the pool without the request's keys, which must not
// stay reachable after it ends.
func (h *Handler) recycle(a *admission) {
	clear(a.req.Keys)
	clear(a.req.Max)
	clear(a.labels)
	a.req.Limits, a.req.Cost = nil, 0
	a.watch.r, a.watch.body = nil, nil
	a.waiting.zone = nil
	a.measured = measuredWriter{}
	h.admissions.Put(a)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
