package limiter

import (
	"fmt"
	"testing"
	"time"
)

// TestSharesOrder: a batch interleaves keys by weight, each key's waiters
// in queue order, and grants charged to a key move it back.
func TestSharesOrder(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	var items []FairItem
	add := func(key string, weight float64) {
		items = append(items, FairItem{Key: key, Weight: weight, Place: Place{Class: Normal, Arrived: now, Seq: uint64(len(items) + 1)}})
	}
	for range 4 {
		add("a", 2) // the flood arrived first
	}
	add("b", 1)
	add("b", 1)
	var s Shares
	order := func() string {
		var out []string
		for _, i := range s.Order(items, now) {
			out = append(out, fmt.Sprint(items[i].Key, items[i].Place.Seq))
		}
		return fmt.Sprint(out)
	}
	// Tags a: 0, .5, 1, 1.5; b: 0, 1. Ties go to the higher score (weight 2).
	if got := order(); got != "[a1 b5 a2 a3 b6 a4]" {
		t.Fatalf("order %s, want [a1 b5 a2 a3 b6 a4]", got)
	}
	for range 3 {
		s.Charge(items[0]) // a was granted three slots
	}
	if got := order(); got[:4] != "[b5 " {
		t.Fatalf("after a's grants, order %s, want b first", got)
	}
}
