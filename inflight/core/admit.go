package core

import (
	"context"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// RefusedEvent is the name of the Caddy event emitted for every refusal.
const RefusedEvent = "inflight_refused"

// Gate admits the units of one handler (HTTP requests, layer4
// connections) into its zone: the one admission path of every protocol. A
// handler joins its gate in Provision (Join), fills a Ticket per unit with
// the unit's keys, admits it (Admit), releases it when the unit ends
// (Release), and leaves in Cleanup (Leave).
type Gate struct {
	cfg         *Config
	ctx         caddy.Context
	logger      *zap.Logger
	events      *caddyevents.App
	zone        *zone
	zoneID      string
	label       string // the zone's name: Zone, or the automatic one
	limits      *limiter.Limits
	adaptive    *limiter.Adaptive // the zone's, with an adaptive total
	waitOpt     limiter.WaitOptions
	costed      bool                            // units have costs: the cost histogram counts them
	classed     bool                            // a priority template gives units their class
	weighted    bool                            // a weight template gives keys their share under fair
	addresses   []bool                          // per limit: its keys are client addresses, logged in clear
	rejected    map[string][]prometheus.Counter // reason -> per dimension, total last
	waited      [limiter.Aborted + 1]prometheus.Observer
	costs       costObserver
	badValues   BadValues // of the weight template
	refusedLog  string    // the debug line of a refusal
	early       bool      // refuse units with deadlines early
	countGrants bool      // count the zone's releases (early refusal, retry hints)
}

// Ticket is one unit's way through a gate. Before Admit the edge sets the
// request's Keys (one per limit; "" leaves a limit out), its Max where a
// limit's max is the unit's own, and its Cost; the gate keeps the rest
// until Release. Tickets are made by InitTicket and may be pooled: Reset
// one before it is reused.
type Ticket struct {
	Req limiter.Request
	// Slot is what the unit holds while admitted, set by Admit: its Used
	// may be set before Release.
	Slot *limiter.Slot
	// OnQueued, if set, runs when the unit starts waiting (the HTTP edge
	// then watches its client).
	OnQueued func()

	labels   []string // per-key metric labels, when enabled
	admitted int64    // monotonic nanoseconds (see nanotime), with per-key metrics
	series   *Gate    // with per-key metrics and a wait: the gate whose keys it counts
	waiting  waitUnits
	queued   func() // bound once, so that passing it allocates nothing
}

// InitTicket readies t for the gate's limits.
func (g *Gate) InitTicket(t *Ticket) {
	n := len(g.cfg.Limits)
	t.Req = limiter.Request{Keys: make([]string, n), Max: make([]int64, n)}
	t.labels = make([]string, n)
	t.queued = t.onQueued
}

// Reset clears t for another unit: its keys must not stay reachable after
// its unit ends.
func (t *Ticket) Reset() {
	clear(t.Req.Keys)
	clear(t.Req.Max)
	clear(t.labels)
	t.Req.Limits, t.Req.Cost, t.Slot = nil, 0, nil
	t.waiting.zone, t.series = nil, nil
}

// onQueued runs when t's unit is queued: its units count as waiting.
func (t *Ticket) onQueued() {
	t.waiting.start(&t.Req)
	if g := t.series; g != nil {
		g.zone.series.queued(g, t)
	}
	if t.OnQueued != nil {
		t.OnQueued()
	}
}

// Verdict is how Admit ended.
type Verdict struct {
	limiter.Result
	// Limit names the limit that refused the unit (`total` for the total)
	// and Reason why (full, timeout, queue_full, keys_full, store_error;
	// dry_run for a unit let through that would have been refused). Both
	// are empty when the unit was admitted or its context ended while it
	// waited (Outcome Aborted).
	Limit, Reason string
}

// Admit takes the unit's units in every limit and the total, waiting as
// the gate's wait allows while ctx lasts, and counts, logs and emits what
// happened. class and weight are what the priority and weight templates
// resolved to for the unit, read only when the handler has them. Admitted,
// the unit holds its units until Release; otherwise it holds nothing.
func (g *Gate) Admit(ctx context.Context, t *Ticket, class, weight string) Verdict {
	return g.admit(ctx, t, class, weight, 0, false)
}

// admit is Admit, and with bounded AdmitWithin.
func (g *Gate) admit(ctx context.Context, t *Ticket, class, weight string, left time.Duration, bounded bool) Verdict {
	t.Req.Limits = g.limits
	opt := g.waitOpt
	if g.classed {
		opt.Class = limiter.ParseClass(class)
	}
	if g.weighted {
		opt.Weight = g.parseWeight(weight)
	}
	if bounded {
		g.deadlineOpt(&opt, left)
	}
	if opt.Wait > 0 {
		t.waiting.zone, opt.Queued = &g.zone.units, t.queued
		if g.cfg.PerKeyMetrics {
			t.series = g
		}
	}

	res := g.zone.Acquire(ctx, &t.Req, opt)
	t.Slot = res.Slot
	t.waiting.end()

	if o := res.Outcome; (o == limiter.Admitted && res.Waited > 0) || o == limiter.Timeout || o == limiter.Aborted {
		g.waited[o].Observe(res.Waited.Seconds())
		if g.cfg.PerKeyMetrics {
			g.zone.series.waited(g, t, o, res.Waited, time.Now())
		}
	}
	switch res.Outcome {
	case limiter.Admitted:
		if g.costed {
			g.costs.observe(t.Slot.Units())
		}
		if g.cfg.PerKeyMetrics {
			g.zone.series.admit(g, t, limiter.Share(opt.Weight, opt.Class))
		}
		return Verdict{Result: res}
	case limiter.Aborted:
		return Verdict{Result: res}
	}
	reason := reasonFor(res.Outcome)
	if g.cfg.DryRun {
		reason = ReasonDryRun
	}
	return Verdict{Result: res, Limit: g.report(t, res, reason), Reason: reason}
}

// report counts, logs and emits a refusal, and returns the refusing limit's
// name. Keys appear only as hashes, except client addresses in debug logs.
func (g *Gate) report(t *Ticket, res limiter.Result, reason string) string {
	name, key := totalName, ""
	if res.Dim != limiter.TotalDim {
		name, key = g.cfg.Limits[res.Dim].Name, t.Req.Keys[res.Dim]
	}
	g.rejected[reason][g.dimIndex(res.Dim)].Inc()
	// Hash the key only for a log line or an event someone will see: under
	// overload every refused unit passes here.
	if ce := g.logger.Check(zapcore.DebugLevel, g.refusedLog); ce != nil {
		shown := key
		if key != "" && !g.addresses[res.Dim] {
			shown = redact(key)
		}
		ce.Write(zap.String("zone", g.label), zap.String("limit", name), zap.String("key", shown), zap.String("reason", reason))
	}
	if g.events != nil && g.events.ShouldEmit(RefusedEvent) { // nil: a gate made without Caddy, in tests
		hashed := ""
		if key != "" {
			hashed = redact(key)
		}
		g.events.Emit(g.ctx, RefusedEvent, map[string]any{"zone": g.label, "limit": name, "key": hashed, "reason": reason})
	}
	return name
}

// Release gives back what Admit took for t's unit. It must be called once
// per admitted unit.
func (g *Gate) Release(t *Ticket) {
	t.Slot.Release()
	if g.countGrants {
		g.zone.grants.add(g.zone.Clock().Now())
	}
	if g.cfg.PerKeyMetrics {
		g.zone.series.release(g, t)
	}
}

// dimIndex maps a result's dimension to the index of its metric children,
// the total last.
func (g *Gate) dimIndex(d int) int {
	if d == limiter.TotalDim {
		return len(g.cfg.Limits)
	}
	return d
}
