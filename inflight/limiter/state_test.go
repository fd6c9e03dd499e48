package limiter

import (
	"context"
	"slices"
	"testing"
	"time"
)

// countIn is dimension d's units and requests in flight (TotalDim: the
// total's), as State reads them.
func countIn(z *Zone, d int) (units, requests int64) {
	st := z.State(Look{Dims: true})
	c := st.Total
	if d != TotalDim {
		c = st.Dims[d].Count
	}
	return c.Units, c.Requests
}

// unitsIn is dimension d's units in flight (TotalDim: the total's).
func unitsIn(z *Zone, d int) int64 {
	units, _ := countIn(z, d)
	return units
}

// keysIn is how many keys of dimension d have units in flight.
func keysIn(z *Zone, d int) int { return z.State(Look{Dims: true}).Dims[d].Keys }

// waitingIn is how many requests the zone has queued.
func waitingIn(z *Zone) int64 { return z.State(Look{}).Waiting }

// unitsOfKey is the units key holds in dimension d, as a request's local
// level reads them.
func unitsOfKey(z *Zone, d int, key string) int64 {
	s, h := z.shardFor(d, key)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count(h)
}

// TestStateReadsOneZone: one read gives the total, the queue, each
// dimension's counts and keys, its keys with the most units in flight and
// its keys with requests waiting, each as the requests left them.
func TestStateReadsOneZone(t *testing.T) {
	z := NewZone(2, true, nil)
	lim := &Limits{Max: []int64{3, 10}, Total: 100}
	for _, r := range []*Request{
		{Keys: []string{"a", "x"}, Cost: 3, Limits: lim},
		{Keys: []string{"b", "x"}, Cost: 2, Limits: lim},
		{Keys: []string{"c", ""}, Limits: lim},
	} {
		mustAdmit(t, z, r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 2 {
		go z.Acquire(ctx, &Request{Keys: []string{"a", "y"}, Limits: lim}, WaitOptions{Wait: time.Hour})
	}
	for waitingIn(z) != 2 {
		time.Sleep(time.Millisecond)
	}

	if st := z.State(Look{}); !st.HasTotal || st.Total != (Count{6, 3}) || st.Waiting != 2 || st.Dims != nil {
		t.Fatalf("State(Look{}) = %+v, want the total {6 3}, 2 waiting and no dimension read", st)
	}
	st := z.State(Look{Top: 2, WaitingKeys: true})
	if got := st.Dims[0]; got.Count != (Count{6, 3}) || got.Keys != 3 {
		t.Errorf("dimension 0: %+v, want 6 units of 3 requests in 3 keys", got)
	}
	if got := st.Dims[1]; got.Count != (Count{5, 2}) || got.Keys != 1 {
		t.Errorf("dimension 1: %+v, want 5 units of 2 requests in 1 key", got)
	}
	if top := st.Dims[0].Top; len(top) != 2 || top[0].Count != 3 || top[1].Count != 2 {
		t.Errorf("dimension 0's top 2 keys: %+v, want a (3 units), then b (2)", top)
	}
	for d, want := range []string{"a", "y"} {
		if w := st.Dims[d].Waiting; len(w) != 1 || w[0].Key != want || w[0].Waiting != 2 {
			t.Errorf("dimension %d's waiting keys: %+v, want %s with 2", d, w, want)
		}
	}
}

// TestLevelsReadAKeysUnitsHere: a request's levels are each dimension's cap
// and the units its key holds here (the total last), an empty key's left
// unknown, the same whether or not the caller gives a slice with room;
// given one, reading them allocates nothing (the RateLimit fields read
// them per response).
func TestLevelsReadAKeysUnitsHere(t *testing.T) {
	z := NewZone(2, true, nil)
	lim := &Limits{Max: []int64{3, 10}, Total: 100}
	mustAdmit(t, z, &Request{Keys: []string{"a", "x"}, Cost: 2, Limits: lim})
	mustAdmit(t, z, &Request{Keys: []string{"b", "x"}, Limits: lim})
	req := &Request{Keys: []string{"a", ""}, Limits: lim}
	want := Levels{{Cap: 3, InFlight: 2}, {}, {Cap: 100, InFlight: 3}}
	buf := [4]Level{{9, 9}, {9, 9}, {9, 9}, {9, 9}} // what a slice kept by the caller held before
	for _, into := range []Levels{nil, buf[:1], buf[:]} {
		if got := z.Levels(req, false, into); !slices.Equal(got, want) {
			t.Errorf("Levels with a slice of room %d = %v, want %v", cap(into), got, want)
		}
	}
	if got := z.Levels(req, true, buf[:]); got != nil {
		t.Errorf("the fleet's levels without a ledger = %v, want none", got)
	}
	if allocs := testing.AllocsPerRun(100, func() { z.Levels(req, false, buf[:]) }); allocs != 0 {
		t.Errorf("Levels into a slice with room allocated %v times, want 0", allocs)
	}
}
