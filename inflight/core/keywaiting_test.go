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
	for z.waiting() < keys+1 {
		time.Sleep(time.Millisecond)
	}
	for _, tc := range []struct {
		display int32
		prefix  string
	}{{keysHashed, "h:"}, {keysPlain, "tenant-"}, {keysAnonymous, "#"}} {
		z.keyDisplay.Store(tc.display)
		got := waitingNow(z)
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
		addKeyWaiting(sum, z, waitingNow(z))
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
	addKeyWaiting(sum, z, waitingNow(z))
	if len(sum) != 0 || len(waitingNow(z)) != 0 {
		t.Fatalf("%d gauges left after the waiters left", len(sum))
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
	for z.waiting() < 1 {
		time.Sleep(time.Millisecond)
	}
	sum := map[[3]string]int64{}
	addKeyWaiting(sum, z, waitingNow(z))
	ch := make(chan prometheus.Metric, len(sum))
	sendKeyWaiting(ch, sum)
	if got := sum[[3]string{"w", "tenant", `v\xffw`}]; len(ch) != 1 || got != 1 {
		t.Fatalf("gauges %v, want key `v\\xffw` waiting 1", sum)
	}
	cancel()
	<-done
}

// waitingNow is z's keys waiting, as a scrape reads them.
func waitingNow(z *zone) []keyWaiting {
	return z.waitingKeys(z.State(limiter.Look{WaitingKeys: true}))
}
