package core

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

func TestKeySeriesAreCappedAndRemovedAtZero(t *testing.T) {
	h := &Gate{cfg: &Config{Zone: "cap-test", Limits: []Limit{{Name: "key"}}}, label: "cap-test"}
	var ks keySeries
	var admitted []*Ticket
	for i := range maxKeySeries + 5 {
		a := newTicket(1)
		a.Req.Keys[0] = fmt.Sprint("key-", i)
		ks.admit(h, a, 1)
		admitted = append(admitted, a)
	}
	if n := testutil.CollectAndCount(keyRequests); n != maxKeySeries+1 {
		t.Fatalf("%d series for %d keys, want %d and one overflow", n, len(admitted), maxKeySeries)
	}
	if got := testutil.ToFloat64(keyRequests.WithLabelValues("cap-test", "key", overflowKey)); got != 5 {
		t.Fatalf("overflow series = %v, want 5", got)
	}
	for _, a := range admitted {
		ks.release(h, a)
	}
	if n := testutil.CollectAndCount(keyRequests); n != 0 || len(ks.keys) != 0 {
		t.Fatalf("%d series and %d tracked keys left after release, want none", n, len(ks.keys))
	}
}

// TestPlainKeySeriesAreOneToOne: with plain keys, the bytes ff fe 80 "bad"
// and the text `\xff\xfe\x80bad` are two keys and two series, each with
// its own count, and a key "_overflow" is not the overflow series.
func TestPlainKeySeriesAreOneToOne(t *testing.T) {
	h := &Gate{cfg: &Config{Zone: "plain-test", Limits: []Limit{{Name: "key"}}, PlainKeys: true}, label: "plain-test"}
	var ks keySeries
	var admitted []*Ticket
	for _, key := range []string{"\xff\xfe\x80bad", `\xff\xfe\x80bad`, overflowKey} {
		a := newTicket(1)
		a.Req.Keys[0] = key
		ks.admit(h, a, 1)
		admitted = append(admitted, a)
	}
	if n := testutil.CollectAndCount(keyRequests); n != 3 {
		t.Fatalf("%d series for 3 keys, want 3", n)
	}
	for _, label := range []string{`\xff\xfe\x80bad`, `\\xff\\xfe\\x80bad`, `\x5foverflow`} {
		if got := testutil.ToFloat64(keyRequests.WithLabelValues("plain-test", "key", label)); got != 1 {
			t.Errorf("series %q = %v, want 1", label, got)
		}
	}
	for _, a := range admitted {
		ks.release(h, a)
	}
	if n := testutil.CollectAndCount(keyRequests); n != 0 {
		t.Fatalf("%d series left after release, want none", n)
	}
}

// TestKeyWaitSeriesAreCappedAndSweptWhenIdle: the waits of 1,005 keys give
// 1,000 series and one overflow of 5 (its keys' labels recorded for their
// release); they outlive the keys' slots, and go once the keys have been
// idle for keyWaitIdle, except a key still holding a slot and one with a
// request waiting.
func TestKeyWaitSeriesAreCappedAndSweptWhenIdle(t *testing.T) {
	h := &Gate{cfg: &Config{Zone: "wait-test", Limits: []Limit{{Name: "tenant"}}, PerKeyMetrics: true}, label: "wait-test"}
	var ks keySeries
	start := time.Now()
	var admitted []*Ticket
	for i := range maxKeySeries + 5 {
		a := newTicket(1)
		a.Req.Keys[0] = fmt.Sprint("tenant-", i)
		ks.waited(h, a, limiter.Admitted, 300*time.Millisecond, start)
		ks.admit(h, a, 1)
		admitted = append(admitted, a)
	}
	if n := testutil.CollectAndCount(keyWaitSeconds); n != maxKeySeries+1 {
		t.Fatalf("%d wait histograms for %d keys, want %d and one overflow", n, len(admitted), maxKeySeries)
	}
	if st := ks.recentWait("tenant", overflowKey, start); st == nil || st.Count != 5 {
		t.Fatalf("overflow's recent waits: %+v, want 5", st)
	}
	if got := testutil.ToFloat64(keyRequests.WithLabelValues("wait-test", "tenant", overflowKey)); got != 5 {
		t.Fatalf("overflow slots = %v, want 5: a waited key is counted under the label of its wait", got)
	}
	if st := ks.recentWait("tenant", redact("tenant-0"), start); st == nil || st.Count != 1 || st.P50 != 0.275 {
		t.Fatalf("tenant-0's recent waits: %+v, want one, p50 0.275 s (half way from the bucket's 0.25 s bound to the wait, 0.3 s)", st)
	}
	holding := admitted[0]
	for _, a := range admitted[1:] {
		ks.release(h, a)
	}
	if n := testutil.CollectAndCount(keyGivenSeconds); n != maxKeySeries {
		t.Fatalf("%d given-seconds counters after %d keys that waited ended, want %d and one overflow, less tenant-0's still held", n, len(admitted)-1, maxKeySeries)
	}

	if n := testutil.CollectAndCount(keyRequests); n != 1 {
		t.Fatalf("%d slot series left, want tenant-0's", n)
	}
	waiting := map[seriesKey]bool{{"tenant", redact("tenant-1")}: true}
	ks.sweep(h.label, time.Now().Add(keyWaitIdle-time.Second), waiting)
	if n := testutil.CollectAndCount(keyWaitSeconds); n != maxKeySeries+1 {
		t.Fatalf("%d wait histograms before the keys were idle for %v, want all %d", n, keyWaitIdle, maxKeySeries+1)
	}
	ks.sweep(h.label, time.Now().Add(keyWaitIdle+time.Second), waiting)
	if n := testutil.CollectAndCount(keyWaitSeconds); n != 2 || len(ks.keys) != 2 {
		t.Fatalf("%d wait histograms and %d keys left once idle, want 2: the key holding a slot and the one waiting", n, len(ks.keys))
	}
	ks.release(h, holding)
	ks.sweep(h.label, time.Now().Add(keyWaitIdle+time.Second), nil)
	if n := testutil.CollectAndCount(keyWaitSeconds); n != 0 || len(ks.keys) != 0 {
		t.Fatalf("%d wait histograms and %d keys left, want none", n, len(ks.keys))
	}
	if n := testutil.CollectAndCount(keyGivenSeconds); n != 0 {
		t.Fatalf("%d given-seconds counters left, want none: they go with the wait series", n)
	}
}

// TestKeyShareKeepsWhatAKeyGotBeforeItWaited: a key's request admitted at
// once, then another queued behind it, then the first released and the
// second admitted and released: the key's share of what its limit gave is
// 1, the only key; before, its entry went with the first release (it had
// not waited yet) and its share was what the second held of the two.
func TestKeyShareKeepsWhatAKeyGotBeforeItWaited(t *testing.T) {
	g := testGate(t, "share-before-wait", &Config{
		Zone:          "share-before-wait",
		Limits:        []Limit{{Name: "tenant", Key: "{tenant}", Max: Max{Fixed: 1}}},
		Wait:          caddy.Duration(time.Minute),
		PerKeyMetrics: true,
	})
	first, second := g.newTicket("long"), g.newTicket("long")
	if g.Admit(context.Background(), first, "", "").Outcome != limiter.Admitted {
		t.Fatal("the first request: want admitted")
	}
	done := make(chan limiter.Outcome)
	go func() { done <- g.Admit(context.Background(), second, "", "").Outcome }()
	eventually(t, "the second request waits", func() bool { return g.zone.waiting() == 1 })
	time.Sleep(10 * time.Millisecond) // the first holds its slot a while: what its key was given
	g.Release(first)
	if o := <-done; o != limiter.Admitted {
		t.Fatalf("the second request: %v, want admitted", o)
	}
	g.Release(second)
	share, _ := g.zone.series.recentShare("tenant", redact("long"), nanotime())
	if share == nil || *share < 0.999 {
		t.Fatalf("the only key's share of what its limit gave: %v, want 1", deref(share))
	}
}

func deref(f *float64) any {
	if f == nil {
		return nil
	}
	return *f
}
