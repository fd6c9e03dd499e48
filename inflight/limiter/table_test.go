package limiter

import (
	"math/rand/v2"
	"testing"
)

// TestTableMatchesAMap drives a table and a plain map with the same random
// increments and decrements, across the inline/overflow boundary, and
// checks they always agree.
func TestTableMatchesAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tb table
	ref := map[uint64]int64{}
	var held int64
	for step := range 200_000 {
		h := uint64(rng.IntN(40)) // few enough keys to collide, more than inline
		if rng.IntN(2) == 0 {
			tb.increment(h, 1)
			ref[h]++
			held++
		} else {
			tb.decrement(h, 1)
			if ref[h] > 0 {
				held--
				if ref[h]--; ref[h] == 0 {
					delete(ref, h)
				}
			}
		}
		if got := tb.count(h); got != ref[h] {
			t.Fatalf("step %d: count(%d) = %d, want %d", step, h, got, ref[h])
		}
		if tb.keys() != len(ref) || tb.inFlight != held {
			t.Fatalf("step %d: keys %d held %d, want %d, %d", step, tb.keys(), tb.inFlight, len(ref), held)
		}
	}
}
