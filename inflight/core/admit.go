package core

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// Gate admits the units of another protocol, such as caddy-l4's
// connections, into a zone the way the HTTP handler admits requests: the
// same engine, zone registry (counts shared by name across handlers and
// reloads), shared stores, metrics, events and admin API. A handler of that
// protocol joins a gate in its Provision, admits each unit with Admit,
// releases the Ticket when the unit ends, and leaves in its Cleanup.
type Gate struct {
	h *Handler
}

// JoinGate provisions the options of cfg that do not depend on HTTP
// (Limits with fixed maxes, Total, Zone, DryRun, Replicas, Wait,
// MaxWaiting, MaxWaitingPerKey, Priority, Fair, Weight, MaxKeys,
// PerKeyMetrics, PlainKeys, StoreRaw) and joins its zone. Keys and the
// priority and weight templates are the caller's to evaluate. An unnamed
// zone is named after site and its position among site's unnamed zones
// (`layer4 :5432#1`). noun names the unit in log lines (`connection`). On error
// the caller must still call Leave, as Caddy calls Cleanup.
func JoinGate(ctx caddy.Context, cfg *Handler, site, noun string) (*Gate, error) {
	for _, l := range cfg.Limits {
		if l.Max.Placeholder != "" {
			return nil, fmt.Errorf("inflight: limit %q: max %q is not allowed here: want a positive integer (placeholders are resolved per HTTP request only)", l.Name, l.Max.Placeholder)
		}
	}
	if cfg.Zone == "" {
		cfg.label = numberedZone(ctx, site)
	}
	cfg.refusedLog = noun + " refused"
	if err := cfg.Provision(ctx); err != nil {
		return &Gate{h: cfg}, err
	}
	return &Gate{h: cfg}, cfg.Validate()
}

// Zone returns the zone's name, as metrics and the admin API show it.
func (g *Gate) Zone() string { return g.h.label }

// Admit takes a slot in every limit for a unit whose key in limit i is
// keys[i] ("" leaves that limit out), waiting as the gate's wait allows
// while ctx lasts. class is the unit's priority (high, normal or low) and
// weight its share under fair, as the priority and weight templates
// resolved; empty when not set.
//
// It returns the ticket of the slots taken, which the caller releases when
// the unit ends, and reason "". Otherwise no slot is held, the ticket is
// nil and reason says why: a refusal (full, timeout, queue_full,
// keys_full, store_error; limit names the refusing limit, `total` for the
// total), counted in the metrics and the admin API, logged at debug and
// emitted as the event RefusedEvent; "dry_run" for a unit that would have
// been refused but is let through, counted and reported the same way; or
// "aborted" when ctx ended while it waited.
func (g *Gate) Admit(ctx context.Context, keys []string, class, weight string) (t *Ticket, limit, reason string) {
	h := g.h
	a := h.admissions.Get().(*admission)
	copy(a.req.Keys, keys)
	a.req.Limits = h.limits
	opt := h.waitOpt
	if class != "" {
		opt.Class = limiter.ParseClass(class)
	}
	if weight != "" && opt.Fair {
		opt.Weight = h.parseWeight(weight)
	}
	res := h.store.Acquire(ctx, &a.req, opt)
	if o := res.Outcome; (o == limiter.Admitted && res.Waited > 0) || o == limiter.Timeout || o == limiter.Aborted {
		h.waited[o].Observe(res.Waited.Seconds())
		if h.PerKeyMetrics {
			h.zone.series.waited(h, a, o, res.Waited, time.Now())
		}
	}
	switch res.Outcome {
	case limiter.Admitted:
		if h.PerKeyMetrics {
			h.zone.series.admit(h, a)
		}
		return &Ticket{h: h, a: a}, "", ""
	case limiter.Aborted:
		h.recycle(a)
		return nil, "", "aborted"
	}
	reason = reasonFor(res.Outcome)
	if h.DryRun {
		reason = reasonDryRun
	}
	limit = h.report(a, res, reason)
	h.recycle(a)
	return nil, limit, reason
}

// Leave leaves the zone, as the HTTP handler's Cleanup: tickets still held
// release into it safely, after a reload into the zone the new config
// shares.
func (g *Gate) Leave() error { return g.h.Cleanup() }

// Ticket is the slots one admitted unit holds.
type Ticket struct {
	h        *Handler
	a        *admission
	released atomic.Bool
}

// Released reports whether Release was called.
func (t *Ticket) Released() bool { return t.released.Load() }

// Release gives the slots back. Only the first call does: a unit whose end
// is seen twice (its connection closed, then its handler returning) is
// released once.
func (t *Ticket) Release() {
	if t.released.Swap(true) {
		return
	}
	t.h.store.Release(&t.a.req)
	if t.h.PerKeyMetrics {
		t.h.zone.series.release(t.h, t.a)
	}
	t.h.recycle(t.a)
}
