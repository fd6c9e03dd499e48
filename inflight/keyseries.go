package inflight

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// maxKeySeries bounds the per-key series of one zone; keys beyond it are
// counted together under overflowKey, so label cardinality stays bounded
// whatever clients send.
const (
	maxKeySeries = 1000
	overflowKey  = "_overflow"
)

var keyRequests = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Namespace: "caddy",
	Subsystem: "inflight",
	Name:      "key_requests",
	Help:      "Slots held now per key (hashed unless plain_keys), for handlers with per_key_metrics; at most 1000 keys per zone, the rest under key _overflow.",
}, []string{"zone", "limit", "key"})

// keySeries tracks the per-key series of a zone, removing each when its
// count reaches zero.
type keySeries struct {
	mu     sync.Mutex
	counts map[seriesKey]int
}

type seriesKey struct{ limit, key string }

// admit adds a's keys, recording in a.labels the label each was counted
// under.
func (k *keySeries) admit(h *Handler, a *admission) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.counts == nil {
		k.counts = map[seriesKey]int{}
	}
	for d, key := range a.req.Keys {
		if key == "" {
			continue
		}
		label := redact(key)
		if h.PlainKeys {
			label = labelValue(key)
		}
		sk := seriesKey{h.Limits[d].Name, label}
		if _, ok := k.counts[sk]; !ok && len(k.counts) >= maxKeySeries {
			sk.key = overflowKey
		}
		a.labels[d] = sk.key
		k.counts[sk]++
		keyRequests.WithLabelValues(h.label, sk.limit, sk.key).Inc()
	}
}

// release takes a's keys away, deleting series that reach zero.
func (k *keySeries) release(h *Handler, a *admission) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for d, label := range a.labels {
		if label == "" {
			continue
		}
		sk := seriesKey{h.Limits[d].Name, label}
		if k.counts[sk]--; k.counts[sk] > 0 {
			keyRequests.WithLabelValues(h.label, sk.limit, sk.key).Dec()
			continue
		}
		delete(k.counts, sk)
		keyRequests.DeleteLabelValues(h.label, sk.limit, sk.key)
	}
}

// top returns up to n series with the most slots, for the admin API.
func (k *keySeries) top(n int) []keyHeld {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]keyHeld, 0, len(k.counts))
	for sk, c := range k.counts {
		out = append(out, keyHeld{Limit: sk.limit, Key: sk.key, Held: int64(c)})
	}
	return topN(out, n)
}
