package limiter

import (
	"cmp"
	"slices"
)

// State is what a zone holds and queues, in one read: what metrics, the
// admin API and the live page show. The total and the number waiting are
// exact at one instant; a dimension's counts are read shard by shard, so a
// key that comes and goes meanwhile can be missed or counted twice.
type State struct {
	// HasTotal says whether the zone counts a zone-wide total.
	HasTotal bool
	// Total is the zone-wide total's units and requests in flight (zero
	// without a total).
	Total Count
	// Waiting is how many requests are queued.
	Waiting int64
	// Dims holds each dimension's counts, by index, if Look.Dims asked.
	Dims []DimState
}

// Count is units in flight and the requests holding them.
type Count struct {
	Units, Requests int64
}

// DimState is one dimension's counts.
type DimState struct {
	Count
	// Keys is how many keys have units in flight. Once the zone counts
	// keys (MaxKeys was used) it is the count admissions check.
	Keys int
	// Top is up to Look.Top keys with the most units in flight, most
	// first.
	Top []KeyCount
	// Waiting is each key with requests waiting, and how many, if
	// Look.WaitingKeys asked.
	Waiting []KeyWaiting
}

// KeyCount is a key's hash and its units in flight.
type KeyCount struct {
	Hash  uint64
	Count int64
}

// KeyWaiting is a key, its hash (as KeyCount has it) and its requests
// waiting.
type KeyWaiting struct {
	Key     string
	Hash    uint64
	Waiting int64
}

// Look says what State reads beyond the total and the queue's length:
// each walks every shard or every waiting flow of the zone.
type Look struct {
	// Dims reads each dimension's units, requests and keys.
	Dims bool
	// Top also lists up to Top keys of each dimension with the most units
	// in flight.
	Top int
	// WaitingKeys also lists each dimension's keys with requests waiting.
	WaitingKeys bool
}

// State returns the zone's state, as much of it as look asks for.
func (z *Zone) State(look Look) State {
	w := z.total.Load()
	st := State{HasTotal: z.hasTotal, Total: Count{w & MaxCost, w >> unitBits}, Waiting: z.queued.Load()}
	if !look.Dims && look.Top <= 0 && !look.WaitingKeys {
		return st
	}
	st.Dims = make([]DimState, len(z.keys))
	for d := range st.Dims {
		st.Dims[d] = z.dimState(d, look.Top)
	}
	if look.WaitingKeys && st.Waiting > 0 {
		z.waitingKeys(st.Dims)
	}
	return st
}

// dimState reads dimension d's shards, one after another.
func (z *Zone) dimState(d, top int) DimState {
	var ds DimState
	var all []KeyCount
	for i := range numShards {
		s := &z.shards[d*numShards+i]
		s.mu.Lock()
		ds.Units += s.inFlight
		ds.Requests += s.requests
		ds.Keys += s.keys()
		if top > 0 {
			all = s.appendCounts(all)
		}
		s.mu.Unlock()
	}
	if z.counting.Load() {
		ds.Keys = int(z.keys[d].n.Load())
	}
	if top > 0 {
		slices.SortFunc(all, func(a, b KeyCount) int { return cmp.Compare(b.Count, a.Count) })
		ds.Top = all[:min(top, len(all))]
	}
	return ds
}

// waitingKeys fills each dimension's keys with requests waiting, and how
// many wait for each. It walks the flows, not the waiters.
func (z *Zone) waitingKeys(dims []DimState) {
	z.mu.Lock()
	defer z.mu.Unlock()
	for d := range dims {
		t := z.keyTally()
		for _, f := range z.byID {
			for ; f != nil; f = f.collide {
				t.add(f.head.req, d, int64(f.n))
			}
		}
		dims[d].Waiting = t.out
	}
}
