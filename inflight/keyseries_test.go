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
