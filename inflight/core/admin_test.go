package core

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// TestStateShowsTopWaiting: the admin API's top_waiting lists the keys
// with the most requests waiting, most first, at most topKeys of them,
// and is empty (not absent) once nobody waits.
func TestStateShowsTopWaiting(t *testing.T) {
	z := &zone{Zone: limiter.NewZone(1, true, nil), label: "top", limits: []string{"tenant"}}
	z.keyDisplay.Store(keysPlain)
	lim := &limiter.Limits{Max: []int64{10}, Total: 1}
	holder := &limiter.Request{Keys: []string{"holder"}, Max: []int64{0}, Limits: lim}
	z.Acquire(context.Background(), holder, limiter.WaitOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	waiting := 0
	for k := range topKeys + 2 { // key k has k+1 waiting
		for range k + 1 {
			waiting++
			go func() {
				z.Acquire(ctx, &limiter.Request{Keys: []string{fmt.Sprint("t", k)}, Max: []int64{0}, Limits: lim}, limiter.WaitOptions{Wait: time.Hour})
				done <- struct{}{}
			}()
		}
	}
	for z.waiting() < int64(waiting) {
		time.Sleep(time.Millisecond)
	}
	top := stateOf(z).TopWaiting
	if len(top) != topKeys {
		t.Fatalf("top_waiting has %d keys, want %d: %+v", len(top), topKeys, top)
	}
	for i, kw := range top {
		k := topKeys + 1 - i
		if kw.Key != fmt.Sprint("t", k) || kw.Waiting != int64(k+1) || kw.Limit != "tenant" {
			t.Fatalf("top_waiting[%d] = %+v, want key t%d of tenant with %d waiting", i, kw, k, k+1)
		}
	}
	cancel()
	for range waiting {
		<-done
	}
	if top := stateOf(z).TopWaiting; top == nil || len(top) != 0 {
		t.Fatalf("top_waiting with nobody waiting: %#v, want empty", top)
	}
}
