package limiter

import (
	"testing"
	"time"
)

// shortWaiter is the head of a fair flow of key (dimension 0), which
// arrived seq-th and went short at place.
func shortWaiter(q *queue, key uint64, seq uint64, place float64) *waiter {
	f := &flow{fair: true, fairKey: key, has: []bool{false}}
	f.head = &waiter{standing: standing{seq: seq}, flow: f, short: true, shortPlace: place}
	q.short[f.head] = 1
	return f.head
}

// Short waiters hold against each other in one order, whatever their keys:
// over three of them, two of one key, the queue order's rule (one key's
// flows by arrival, other keys by place) goes round in a circle, and each
// held against the next, none was admitted while the allowance they
// waited for sat idle (seen in TestFleetFairCyclingCosts).
func TestShortFlowsHoldInOneOrder(t *testing.T) {
	z := &Zone{}
	z.short = map[*waiter]int64{}
	// a and b share a key, b arrived first; c's place is between theirs.
	a := shortWaiter(&z.queue, 1, 2, 24.77)
	b := shortWaiter(&z.queue, 1, 1, 26.27)
	c := shortWaiter(&z.queue, 2, 3, 25.86)
	shorts := []*waiter{a, b, c}
	// holds[i][j]: shorts[i] holds against shorts[j]'s try.
	var holds [3][3]bool
	for j, s := range shorts {
		var r reservation
		r.pendingFor(z, s, time.Now())
		for i, g := range shorts {
			if i != j {
				holds[i][j] = r.after(g)
			}
		}
	}
	for i := range shorts {
		for j := range shorts {
			if i != j && holds[i][j] == holds[j][i] {
				t.Errorf("waiters %d and %d: each holds against the other's try: %v", i, j, holds[i][j])
			}
			for k := range shorts {
				if i != j && j != k && i != k && holds[i][j] && holds[j][k] && !holds[i][k] {
					t.Errorf("waiter %d holds against %d, %d against %d, but %d not against %d: no waiter is first", i, j, j, k, i, k)
				}
			}
		}
	}
	if !holds[1][0] {
		t.Errorf("the key's earlier waiter does not hold against its later one")
	}
}

// A short flow's holder never stands before its own head's turn: a
// correction that moved its key's place back would put it before the
// short flows between, which hold against its head, and none would be
// admitted.
func TestShortFlowsHolderStandsAfterItsHead(t *testing.T) {
	z := &Zone{}
	z.short = map[*waiter]int64{}
	z.vclock.tags = map[uint64]float64{1: 2.39} // moved back since a went short
	a := shortWaiter(&z.queue, 1, 1, 3.99)
	a.next = &waiter{standing: standing{seq: 4}, flow: a.flow}
	b := shortWaiter(&z.queue, 2, 2, 3.52)
	var r reservation
	if !r.pendingFor(z, a, time.Now()).after(b) {
		t.Fatalf("b (%.2f) does not hold against a (%.2f)", b.shortPlace, a.shortPlace)
	}
	if z.turn(a.flow).before(z.turnOf(b), time.Now()) {
		t.Errorf("a's holder (its key's place %.2f) stands before b (%.2f), which holds against a's head (%.2f)", z.vclock.place(1), b.shortPlace, a.shortPlace)
	}
}
