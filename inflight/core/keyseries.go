package core

import (
	"sync"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
	"github.com/caddy-inflight/caddy-inflight/inflight/metric"
)

// maxKeySeries bounds the keys of one zone in per-key series; keys beyond
// it are counted together under overflowKey, so label cardinality stays
// bounded whatever clients send.
const (
	maxKeySeries = 1000
	overflowKey  = "_overflow"
)

// keyWaitIdle is how long a key's wait series outlive its last wait once
// it holds no slot and has no request waiting: long enough for a few
// scrapes to see its last wait, short enough that keys come and go.
const keyWaitIdle = 5 * time.Minute

// keyWaitBuckets are the per-key wait histogram's upper bounds, in
// seconds: a coarse subset of waitBuckets, as every key multiplies them.
var keyWaitBuckets = []float64{.01, .05, .25, 1, 5, 30, 120}

var (
	keyRequests = metric.Gauge("caddy_inflight_key_requests",
		"Slots held now per key (hashed unless plain_keys), for handlers with per_key_metrics; at most 1000 keys per zone, the rest under key _overflow.",
		"zone", "limit", "key")

	keyWaitSeconds = metric.Histogram("caddy_inflight_key_wait_seconds",
		"Time requests spent waiting for an inflight slot per key (hashed unless plain_keys) and outcome (admitted, timeout, aborted), for handlers with per_key_metrics; at most 1000 keys per zone, the rest under key _overflow; a key's series go 5 minutes after its last wait once it holds no slot and has no request waiting.",
		keyWaitBuckets, "zone", "limit", "key", "outcome")

	keyGivenSeconds = metric.Counter("caddy_inflight_key_given_seconds_total",
		"Unit-seconds (slot-seconds, or the cost's units × seconds) held by the requests of each key that waited, counted as each request ends, for handlers with per_key_metrics: one key's rate over the sum of its limit's is its share of what the backend gave, to set beside its weight under fair; the series goes with the key's wait series.",
		"zone", "limit", "key")
)

// keySeries tracks the per-key series of a zone: the slots each key holds
// (its series removed when the count reaches zero) and its requests' waits
// (removed by sweep once idle).
type keySeries struct {
	mu   sync.Mutex
	keys map[seriesKey]*keyStats
	// given is, per limit, the unit-seconds its keys' requests that ended
	// held recently: what a key's share is of.
	given map[string]*givenWindow
}

type seriesKey struct{ limit, key string }

type keyStats struct {
	held  int
	units int64     // held by its requests, for the admin API's top keys
	waits *keyWaits // nil until one of its waits ends
	// given is the unit-seconds its requests that ended held recently,
	// and weight its share under fair (0 in other limits).
	given  givenWindow
	weight float64
}

// keyWaits are a key's waits that ended.
type keyWaits struct {
	outcomes uint8     // a bit per limiter.Outcome with a series
	idle     time.Time // since when it has held no slot and ended no wait
	recent   waitWindow
}

// keyLabel is how g's per-key series show key.
func (g *Gate) keyLabel(key string) string {
	if g.cfg.PlainKeys {
		return LabelValue(key)
	}
	return redact(key)
}

// entry returns the stats of a key, or the overflow's when the zone has
// maxKeySeries keys already, and the series key they are counted under.
// mu must be held.
func (k *keySeries) entry(limit, label string) (seriesKey, *keyStats) {
	if k.keys == nil {
		k.keys = map[seriesKey]*keyStats{}
	}
	sk := seriesKey{limit, label}
	s, ok := k.keys[sk]
	if ok {
		return sk, s
	}
	if len(k.keys) >= maxKeySeries {
		sk.key = overflowKey
		if s = k.keys[sk]; s != nil {
			return sk, s
		}
	}
	s = new(keyStats)
	k.keys[sk] = s
	return sk, s
}

// admit adds a's keys, recording in t.labels the label each was counted
// under (already there if it waited), and the fair limit's key's weight.
func (k *keySeries) admit(g *Gate, t *Ticket, weight float64) {
	t.admitted = nanotime()
	k.mu.Lock()
	defer k.mu.Unlock()
	for d, key := range t.Req.Keys {
		if key == "" {
			continue
		}
		label := t.labels[d]
		if label == "" {
			label = g.keyLabel(key)
		}
		sk, s := k.entry(g.cfg.Limits[d].Name, label)
		t.labels[d] = sk.key
		s.held++
		s.units += t.Slot.Units()
		if g.waitOpt.Fair && d == g.waitOpt.KeyDim {
			s.weight = weight
		}
		keyRequests.WithLabelValues(g.label, sk.limit, sk.key).Inc()
	}
}

// release takes t's keys away, deleting series that reach zero, and
// counts the unit-seconds its request held under each key.
func (k *keySeries) release(g *Gate, t *Ticket) {
	now := nanotime()
	given := float64(t.Slot.UsedUnits()) * time.Duration(now-t.admitted).Seconds()
	k.mu.Lock()
	defer k.mu.Unlock()
	for d, label := range t.labels {
		if label == "" {
			continue
		}
		sk := seriesKey{g.cfg.Limits[d].Name, label}
		s := k.keys[sk]
		s.given.add(now, given)
		if s.waits != nil {
			keyGivenSeconds.WithLabelValues(g.label, sk.limit, sk.key).Add(given)
		}
		k.limitGiven(sk.limit).add(now, given)
		s.units -= t.Slot.Units()
		if s.held--; s.held > 0 {
			keyRequests.WithLabelValues(g.label, sk.limit, sk.key).Dec()
			continue
		}
		keyRequests.DeleteLabelValues(g.label, sk.limit, sk.key)
		if s.waits == nil {
			delete(k.keys, sk)
			continue
		}
		s.waits.idle = time.Now()
	}
}

// queued marks t's keys as keys that wait, as its request starts waiting:
// a key that waits keeps its entry, and what it was given, once it holds
// no slot (its wait series go when idle, see sweep), so its share counts
// its requests admitted before it first waited too.
func (k *keySeries) queued(g *Gate, t *Ticket) {
	now := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.eachWaiting(g, t, now, func(seriesKey, *keyWaits) {})
}

// waited records, under each of t's keys, how long its request waited and
// how the wait ended.
func (k *keySeries) waited(g *Gate, t *Ticket, o limiter.Outcome, took time.Duration, now time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.eachWaiting(g, t, now, func(sk seriesKey, w *keyWaits) {
		w.outcomes |= 1 << o
		w.idle = now
		w.recent.observe(now, took.Seconds())
		keyWaitSeconds.WithLabelValues(g.label, sk.limit, sk.key, outcomeLabel(o)).Observe(took.Seconds())
	})
}

// eachWaiting calls f with each of t's keys' waits, made (idle since now)
// if the key had none, and records in t.labels the label of each key. mu
// must be held.
func (k *keySeries) eachWaiting(g *Gate, t *Ticket, now time.Time, f func(seriesKey, *keyWaits)) {
	for d, key := range t.Req.Keys {
		if key == "" {
			continue
		}
		sk, s := k.entry(g.cfg.Limits[d].Name, g.keyLabel(key))
		t.labels[d] = sk.key
		if s.waits == nil {
			s.waits = &keyWaits{idle: now}
		}
		f(sk, s.waits)
	}
}

// sweep removes the wait series of keys that have held no slot and ended
// no wait for keyWaitIdle, unless they have requests waiting.
func (k *keySeries) sweep(zone string, now time.Time, waiting map[seriesKey]bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for sk, s := range k.keys {
		if s.held > 0 || s.waits == nil || waiting[sk] || now.Sub(s.waits.idle) < keyWaitIdle {
			continue
		}
		s.deleteWaits(zone, sk)
		delete(k.keys, sk)
	}
}

// forget removes the wait series of a zone that is dropped (it has
// nothing in flight or waiting).
func (k *keySeries) forget(zone string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for sk, s := range k.keys {
		s.deleteWaits(zone, sk)
	}
	k.keys = nil
}

func (s *keyStats) deleteWaits(zone string, sk seriesKey) {
	if s.waits == nil {
		return
	}
	keyGivenSeconds.DeleteLabelValues(zone, sk.limit, sk.key)
	for _, o := range waitOutcomes {
		if s.waits.outcomes&(1<<o) != 0 {
			keyWaitSeconds.DeleteLabelValues(zone, sk.limit, sk.key, outcomeLabel(o))
		}
	}
}

// recentWait sums up a key's waits that ended in the last one to two
// minutes, or returns nil if it has none.
func (k *keySeries) recentWait(limit, key string, now time.Time) *WaitState {
	k.mu.Lock()
	defer k.mu.Unlock()
	s := k.keys[seriesKey{limit, key}]
	if s == nil || s.waits == nil {
		return nil
	}
	st := s.waits.recent.state(now)
	if st.Count == 0 {
		return nil
	}
	return &st
}

// top returns up to n series with the most units, for the admin API.
func (k *keySeries) top(n int) []keyInFlight {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]keyInFlight, 0, len(k.keys))
	for sk, s := range k.keys {
		if s.held > 0 {
			out = append(out, keyInFlight{Limit: sk.limit, Key: sk.key, InFlight: s.units})
		}
	}
	return topN(out, n)
}
