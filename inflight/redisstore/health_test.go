package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
	"github.com/caddy-inflight/caddy-inflight/inflight/storestatus"
)

// TestHealth: the admin API's store health follows Redis: reachable while
// it answers, unreachable once an operation fails, and reachable again
// once it answers again.
func TestHealth(t *testing.T) {
	addr, _ := startRedis(t)
	proxy := newFaultProxy(t, addr)
	// A timeout no load reaches: only the proxy being down fails a call.
	s := newStore(t, store(proxy.addr, func(s *Store) { s.Timeout = caddy.Duration(5 * time.Second) }))
	limits := &limiter.Limits{Max: []int64{10}}
	z := zoneOf(t, s, "health", limits)
	health := func() storestatus.Health {
		s.book.mu.Lock()
		defer s.book.mu.Unlock()
		return s.book.ledgers[s.book.prefix+":"+keySchema+":{health}"].Health()
	}
	admit := func() {
		if res := z.Acquire(context.Background(), request(limits, "k"), limiter.WaitOptions{}); res.Outcome == limiter.Admitted {
			res.Slot.Release()
		}
	}

	admit()
	if h := health(); h != (storestatus.Health{Type: "redis", Reachable: true}) {
		t.Fatalf("with Redis up: %+v, want redis reachable", h)
	}
	proxy.setDown(true)
	admit()
	if h := health(); h.Reachable {
		t.Fatalf("after an admission failed with Redis down: %+v, want unreachable", h)
	}
	proxy.setDown(false)
	eventually(t, "the store is reachable again", func() bool {
		admit()
		return health().Reachable
	})
}
