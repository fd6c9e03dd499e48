package integration

import (
	"context"
	"sync"
	"testing"
	"time"
)

// The cap counts the requests Caddy is serving. A client that gives up
// (closes its connection, resets its stream) ends its request in Caddy at
// once and frees its slot; reverse_proxy cancels the upstream request, but a
// backend that does not stop work when its connection closes goes on with
// it. This measures what such a backend sees behind `inflight 5`, for the
// README's Guarantees.
func TestAbandonedRequestsKeepAStubbornBackendBusy(t *testing.T) {
	stubborn := newSlowBackend(t, 500*time.Millisecond)
	b := &backend{addr: stubborn.addr}
	cfg, url := site(t, b, "\tinflight 5")
	load(t, cfg)
	c := client("127.0.0.1")

	// 20 rounds: 5 requests that give up after 30 ms.
	var wg sync.WaitGroup
	for range 20 {
		for range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
				defer cancel()
				get(ctx, c, url+"/")
			}()
		}
		time.Sleep(35 * time.Millisecond)
	}
	wg.Wait()
	t.Logf("behind inflight 5, a backend that ignores disconnects had %d requests at once", stubborn.peak.Load())
	if p := stubborn.peak.Load(); p <= 5 {
		t.Fatalf("backend peak %d: the cap held, so the README's statement that abandoned requests escape it is wrong", p)
	}
	eventually(t, "the zone is empty", func() bool { return metric(t, "caddy_inflight_requests") == 0 })
}
