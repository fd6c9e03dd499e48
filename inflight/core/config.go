// Package core is what every protocol's inflight handler shares: the
// options they have in common (Config), the zone registry (zones shared by
// name across handlers, protocols and reloads), the one admission path
// (Gate: the engine's Acquire and Release, with refusal reasons, metrics,
// waiting units, per-key series, logs and events) and the observability
// (Prometheus collectors, the admin API `admin.api.inflight`, the live
// page's files). The HTTP handler (package inflight) and the caddy-l4
// handler (module layer4) are thin edges around it: they turn their
// requests or connections into keys and call Gate.Admit and Gate.Release.
// It depends on the engine (inflight/limiter), never on an edge.
package core

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// Config is the options every protocol's inflight handler shares, inlined
// in each handler's JSON. A unit is what the handler admits: an HTTP
// request, or a layer4 connection.
type Config struct {
	// Limits are the dimensions a unit must fit in, all of them, to be
	// admitted: per client IP, per API key, per tenant, and so on.
	Limits []Limit `json:"limits,omitempty"`

	// Total caps the units in flight through this handler (its zone)
	// across all keys, up to 2^40-1. 0 means no total cap.
	Total int `json:"total,omitempty"`

	// Zone names the counters: handlers with the same zone share them,
	// across sites, routes and protocols, and must have the same limits
	// (names and keys). A handler without a zone has counters of its own,
	// in a zone named after where it stands and its position among the
	// unnamed inflight handlers there (`example.com#1`, `layer4 :5432#1`),
	// which is what metrics and the admin API show. Counts carry over a
	// reload either way, as long as the zone's name and limits stay the
	// same. A name may not contain `#`.
	Zone string `json:"zone,omitempty"`

	// DryRun counts and reports everything as if enforced (refusals appear
	// in metrics with reason `dry_run`, and in logs) but lets every unit
	// through; a unit that would be refused takes no slot.
	DryRun bool `json:"dry_run,omitempty"`

	// Replicas is the number of Caddy instances sharing the load: each
	// enforces ceil(max/replicas) of every limit and of the total (with a
	// store, only while it is unreachable). Default: 1.
	Replicas int `json:"replicas,omitempty"`

	// Wait is how long a unit over a cap may wait for a slot before it is
	// refused with reason `timeout`. 0 (the default) refuses at once.
	Wait caddy.Duration `json:"wait,omitempty"`

	// MaxWaiting bounds the units waiting in this handler's zone; one more
	// is refused at once with reason `queue_full`. Default with `wait`:
	// 1000.
	MaxWaiting int `json:"max_waiting,omitempty"`

	// Priority is a placeholder template giving each waiting unit its
	// class: `high`, `normal` or `low` (a value that is none of them counts
	// as normal; a fixed one must be one of them). When a slot
	// frees, the waiter with the highest weight × (1 + seconds waited / 30)
	// goes first, with weights high 2, normal 1, low 0.5. With Fair, the
	// class weight is also the key's default share. It must come from
	// something the operator controls (a map of an authenticated identity):
	// a client that chooses its class makes itself high.
	Priority string `json:"priority,omitempty"`

	// Fair names the limit whose keys share the slots fairly while units
	// wait: a freed slot goes to the waiting key that has been granted the
	// fewest slots relative to its weight, so each key with waiters gets its
	// weighted share of the cap however many units it queues, and a key
	// that arrives behind a flood is served at the next freed slot its share
	// calls for. Without it, the queue order is the priority score alone.
	// The limit's key should be an authenticated identity: a client that
	// can invent keys gets a share for each.
	Fair string `json:"fair,omitempty"`

	// Weight is a placeholder template giving a key's share under Fair: a
	// positive number from 0.001 to 1000 (2 gets twice the slots of 1).
	// Default: the unit's priority class weight (high 2, normal 1, low
	// 0.5). A value outside the range counts as the nearest bound, and one
	// that is not a positive number as 1; each is logged once per value. A
	// fixed weight (no placeholder) outside the range is refused at load.
	// It must come from something the operator controls (a map of an
	// authenticated identity), never from a value the client chooses.
	Weight string `json:"weight,omitempty"`

	// MaxWaitingPerKey bounds the units waiting with one key (of the Fair
	// limit, or else of the first limit); one more is refused at once with
	// reason `queue_full`. 0 (the default) means no bound besides
	// MaxWaiting.
	MaxWaitingPerKey int `json:"max_waiting_per_key,omitempty"`

	// MaxKeys bounds the keys each limit of the zone holds at once, so that
	// a flood of distinct keys cannot grow memory without end: a unit
	// with a key not yet in flight is refused (reason `keys_full`) once the
	// bound is reached, exactly: while MaxKeys keys of that limit are in
	// flight. Units of keys already in flight are unaffected. 0 means no
	// bound. With a shared store it bounds the keys this instance holds.
	MaxKeys int `json:"max_keys,omitempty"`

	// PerKeyMetrics exports `caddy_inflight_key_requests{zone,limit,key}`,
	// one series per key in flight, the key as a short SHA-256 hash (its
	// raw value with PlainKeys), `caddy_inflight_key_waiting` and the
	// histogram `caddy_inflight_key_wait_seconds{zone,limit,key,outcome}`
	// of the time each key's units waited. A key's requests series is
	// removed when its count reaches zero, its wait series when it has held
	// no slot, had no waiter and ended no wait for 5 minutes; beyond 1000
	// keys per zone the rest are counted under key `_overflow`. Off by
	// default.
	PerKeyMetrics bool `json:"per_key_metrics,omitempty"`

	// PlainKeys shows raw keys instead of hashes in per-key metrics and in
	// the admin API. Keys may be secrets (API keys, cookies): turn this on
	// only where metrics are private.
	PlainKeys bool `json:"plain_keys,omitempty"`

	// StoreRaw keeps the counts in a store shared by a fleet of Caddy
	// instances, so one cap holds across all of them (a lease per unit,
	// renewed while it is in flight); `replicas` then only divides the caps
	// each instance enforces alone while the store is unreachable. Module
	// namespace: `http.handlers.inflight.stores` (`redis`). Default:
	// counts in this process.
	StoreRaw json.RawMessage `json:"store,omitempty" caddy:"namespace=http.handlers.inflight.stores inline_key=type"`
}

// DefaultMaxWaiting is MaxWaiting's default with Wait.
const DefaultMaxWaiting = 1000

func (c *Config) setDefaults() {
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Wait > 0 && c.MaxWaiting == 0 {
		c.MaxWaiting = DefaultMaxWaiting
	}
}

// check reports the first value that is not allowed, defaults applied;
// otherTotal tells that the edge caps the total itself (an adaptive total).
func (c *Config) check(otherTotal bool) error {
	if err := checkLimits(c.Limits); err != nil {
		return err
	}
	switch {
	case len(c.Limits) == 0 && c.Total == 0 && !otherTotal:
		return fmt.Errorf("no limit: give a max (inflight 20), a limit or a total")
	case c.Total < 0 || c.Total > limiter.MaxCost:
		return fmt.Errorf("total %d is not allowed: want %s (0 for none)", c.Total, CapRange)
	case c.Replicas < 1:
		return fmt.Errorf("replicas %d is not allowed: want a positive integer", c.Replicas)
	case c.Wait < 0:
		return fmt.Errorf("wait %s is not allowed: want a positive duration (0 refuses at once)", time.Duration(c.Wait))
	case c.MaxWaiting < 0:
		return fmt.Errorf("max_waiting %d is not allowed: want a positive integer", c.MaxWaiting)
	case c.MaxKeys < 0:
		return fmt.Errorf("max_keys %d is not allowed: want a positive integer (0 for none)", c.MaxKeys)
	}
	if err := c.CheckWaitingPerKey(); err != nil {
		return err
	}
	if err := CheckZone(c.Zone); err != nil {
		return err
	}
	return CheckPriority(c.Priority)
}

// CheckWaitingPerKey refuses a bound on one key's waiting units above the
// bound on all of them, max_waiting (its default with wait): it could
// never be reached, a mistake for a lower one.
func (c *Config) CheckWaitingPerKey() error {
	all, what := c.MaxWaiting, "max_waiting"
	if all == 0 && c.Wait > 0 {
		all, what = DefaultMaxWaiting, "max_waiting's default"
	}
	if all > 0 && c.MaxWaitingPerKey > all {
		return fmt.Errorf("max_waiting_per_key %d is not allowed above %s (%d): one key can never have more waiting than the whole zone; want at most %d, or a larger max_waiting", c.MaxWaitingPerKey, what, all, all)
	}
	return nil
}
