package inflight

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestKeySeriesAreCappedAndRemovedAtZero(t *testing.T) {
	h := &Handler{Zone: "cap-test", label: "cap-test", Limits: []Limit{{Name: "key"}}}
	var ks keySeries
	var admitted []*admission
	for i := range maxKeySeries + 5 {
		a := newAdmission(1)
		a.req.Keys[0] = fmt.Sprint("key-", i)
		ks.admit(h, a)
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
	if n := testutil.CollectAndCount(keyRequests); n != 0 || len(ks.counts) != 0 {
		t.Fatalf("%d series and %d tracked keys left after release, want none", n, len(ks.counts))
	}
}

// TestPlainKeySeriesAreOneToOne: with plain keys, the bytes ff fe 80 "bad"
// and the text `\xff\xfe\x80bad` are two keys and two series, each with
// its own count, and a key "_overflow" is not the overflow series.
func TestPlainKeySeriesAreOneToOne(t *testing.T) {
	h := &Handler{Zone: "plain-test", label: "plain-test", Limits: []Limit{{Name: "key"}}, PlainKeys: true}
	var ks keySeries
	var admitted []*admission
	for _, key := range []string{"\xff\xfe\x80bad", `\xff\xfe\x80bad`, overflowKey} {
		a := newAdmission(1)
		a.req.Keys[0] = key
		ks.admit(h, a)
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
