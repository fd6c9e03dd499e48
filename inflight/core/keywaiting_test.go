package core

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// TestKeyWaitingIsCappedShownAsAskedAndGoneAtZero: 1,005 keys waiting give
// 1,000 series and one overflow of 5, with keys hashed, raw or anonymous
// as configured, and none once nobody waits.
func TestKeyWaitingIsCappedShownAsAskedAndGoneAtZero(t *testing.T) {
	z := &zone{Zone: limiter.NewZone(1, true, nil), label: "w", limits: []string{"tenant"}}
	lim := &limiter.Limits{Max: []int64{10}, Total: 1}
	holder := &limiter.Request{Keys: []string{"holder"}, Max: []int64{0}, Limits: lim}
	z.Acquire(context.Background(), holder, limiter.WaitOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	const keys = maxKeySeries + 5
	done := make(chan struct{}, keys+1)
	for i := range keys + 1 {
		key := fmt.Sprint("tenant-", i)
		if i == keys {
			key = "tenant-0" // a second waiter of one key
		}
		go func() {
			z.Acquire(ctx, &limiter.Request{Keys: []string{key}, Max: []int64{0}, Limits: lim}, limiter.WaitOptions{Wait: time.Hour})
			done <- struct{}{}
		}()
	}
	for z.Waiting() < keys+1 {
		time.Sleep(time.Millisecond)
	}
	for _, tc := range []struct {
		display int32
		prefix  string
	}{{keysHashed, "h:"}, {keysPlain, "tenant-"}, {keysAnonymous, "#"}} {
		z.keyDisplay.Store(tc.display)
		got := z.waitingKeys()
		if len(got) != maxKeySeries+1 || got[0].Waiting != 2 {
			t.Fatalf("display %d: %d entries, first %+v; want %d, the first with 2 waiting", tc.display, len(got), got[0], maxKeySeries+1)
		}
		if last := got[len(got)-1]; last.Key != overflowKey || last.Waiting != 5 || last.Limit != "tenant" {
			t.Fatalf("display %d: last entry %+v, want the overflow of 5", tc.display, last)
		}
		if !strings.HasPrefix(got[0].Key, tc.prefix) {
			t.Fatalf("display %d: key %q, want prefix %q", tc.display, got[0].Key, tc.prefix)
		}
		sum := map[[3]string]int64{}
		addKeyWaiting(sum, z)
		if want := map[bool]int{true: 0, false: maxKeySeries + 1}[tc.display == keysAnonymous]; len(sum) != want {
			t.Fatalf("display %d: %d gauges, want %d", tc.display, len(sum), want)
		}
	}
	cancel()
	for range keys + 1 {
		<-done
	}
	z.keyDisplay.Store(keysHashed)
	sum := map[[3]string]int64{}
	addKeyWaiting(sum, z)
	if len(sum) != 0 || len(z.waitingKeys()) != 0 {
		t.Fatalf("%d gauges left after the waiters left", len(sum))
	}
}

// full is a ledger that refuses every request: its requests wait.
type full struct{}

func (full) Give(string, bool)            {}
func (full) Correct(int, string, float64) {}
func (full) Record(limiter.Claim) string  { return "" }
func (full) Idle()                        {}

func (full) Take(claims []limiter.Claim) ([]limiter.Verdict, error) {
	out := make([]limiter.Verdict, len(claims))
	for i := range out {
		out[i] = limiter.Verdict{Outcome: limiter.Full}
	}
	return out, nil
}

// TestKeyWaitingCountsTheSharedStoresQueues: keys waiting in shared
// queues show, summed with this process's: across a reload that changed
// the store's options, the old and the new queue both have waiters, and a
// key that waits in this process too (on_error open while Redis was away)
// shows once, with all counted. A queue that empties leaves the zone's
// list.
func TestKeyWaitingCountsTheSharedStoresQueues(t *testing.T) {
	z := &zone{Zone: limiter.NewZone(1, true, nil), label: "w", limits: []string{"tenant"}}
	z.keyDisplay.Store(keysPlain)
	lim := &limiter.Limits{Max: []int64{10}, Total: 1}
	req := func(key string) *limiter.Request {
		return &limiter.Request{Keys: []string{key}, Max: []int64{0}, Limits: lim}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	old, current := limiter.NewSharedQueue(z.Zone, full{}, time.Hour), limiter.NewSharedQueue(z.Zone, full{}, time.Hour)
	for _, w := range []struct {
		q   *limiter.SharedQueue
		key string
	}{{old, "a"}, {old, "b"}, {current, "b"}} {
		go w.q.Acquire(ctx, req(w.key), limiter.WaitOptions{Wait: time.Hour})
	}
	z.Acquire(context.Background(), req("holder"), limiter.WaitOptions{})
	go z.Acquire(ctx, req("b"), limiter.WaitOptions{Wait: time.Hour}) // waits in this process
	for z.Waiting() < 1 || z.WaitingOutside() < 3 {
		time.Sleep(time.Millisecond)
	}
	if n := z.waiting(); n != 4 {
		t.Fatalf("%d waiting, want 4 (1 here, 2 in the old queue, 1 in the new)", n)
	}
	got := map[string]int64{}
	for _, kw := range z.waitingKeys() {
		got[kw.Key] = kw.Waiting
	}
	if len(got) != 2 || got["a"] != 1 || got["b"] != 3 {
		t.Fatalf("waiting keys %v, want a: 1 and b: 3", got)
	}
	sum := map[[3]string]int64{}
	addKeyWaiting(sum, z)
	if sum[[3]string{"w", "tenant", "b"}] != 3 {
		t.Fatalf("gauges %v, want b at 3", sum)
	}
	cancel()
	for z.WaitingOutside() > 0 || z.Waiting() > 0 {
		time.Sleep(time.Millisecond)
	}
	if n := len(z.SharedQueues()); n != 0 {
		t.Fatalf("%d queues of the zone listed after they emptied, want none", n)
	}
}

// TestPlainWaitingKeysAreValidLabels: a waiting key that is not valid
// UTF-8, shown plain, is escaped as the held keys are, so a scrape can
// send its gauge (an invalid label value would panic).
func TestPlainWaitingKeysAreValidLabels(t *testing.T) {
	z := &zone{Zone: limiter.NewZone(1, true, nil), label: "w", limits: []string{"tenant"}}
	z.keyDisplay.Store(keysPlain)
	lim := &limiter.Limits{Max: []int64{10}, Total: 1}
	z.Acquire(context.Background(), &limiter.Request{Keys: []string{"holder"}, Max: []int64{0}, Limits: lim}, limiter.WaitOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		z.Acquire(ctx, &limiter.Request{Keys: []string{"v\xffw"}, Max: []int64{0}, Limits: lim}, limiter.WaitOptions{Wait: time.Hour})
		close(done)
	}()
	for z.Waiting() < 1 {
		time.Sleep(time.Millisecond)
	}
	sum := map[[3]string]int64{}
	addKeyWaiting(sum, z)
	ch := make(chan prometheus.Metric, len(sum))
	sendKeyWaiting(ch, sum)
	if got := sum[[3]string{"w", "tenant", `v\xffw`}]; len(ch) != 1 || got != 1 {
		t.Fatalf("gauges %v, want key `v\\xffw` waiting 1", sum)
	}
	cancel()
	<-done
}
