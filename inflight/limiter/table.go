package limiter

// table counts the units in flight per key hash within one shard (a
// request of cost c holds c units of its key). The first
// keys live inline, on the shard's own cache lines, so the common case
// (few keys in flight per shard) touches no memory outside the shard; the
// rest overflow to a map.
//
// Invariants: inline[:n] hold distinct hashes, each with a count above
// zero; more holds the other hashes with a count above zero; no hash is in
// both. more is nil until the inline entries are all in use, and gives
// its memory back as keys leave (see shrink). inFlight is the sum of the
// counts, and requests the requests that hold them.
type table struct {
	n        int32
	peak     int32 // largest len(more) since it was made
	inFlight int64 // sum of all counts (units), for metrics
	requests int64 // requests holding them, for metrics
	more     map[uint64]int64
	inline   [inlineKeys]entry
}

type entry struct {
	hash  uint64
	count int64
}

// inlineKeys fills a shard to two cache lines, with its counts.
const inlineKeys = 5

// count returns the units in flight for hash.
func (t *table) count(hash uint64) int64 {
	for i := range t.n {
		if t.inline[i].hash == hash {
			return t.inline[i].count
		}
	}
	if t.more == nil {
		return 0
	}
	return t.more[hash]
}

// increment adds a request of units to hash's count and reports whether
// hash is a new key.
func (t *table) increment(hash uint64, units int64) (added bool) {
	t.inFlight += units
	t.requests++
	for i := range t.n {
		if t.inline[i].hash == hash {
			t.inline[i].count += units
			return false
		}
	}
	if t.more != nil {
		if n, ok := t.more[hash]; ok {
			t.more[hash] = n + units
			return false
		}
	}
	if t.n < inlineKeys {
		t.inline[t.n] = entry{hash: hash, count: units}
		t.n++
		return true
	}
	if t.more == nil {
		t.more = make(map[uint64]int64)
	}
	t.more[hash] = units
	t.peak = max(t.peak, int32(len(t.more)))
	return true
}

// decrement takes a request of units from hash's count and reports
// whether that removed the key.
func (t *table) decrement(hash uint64, units int64) (removed bool) {
	for i := range t.n {
		if e := &t.inline[i]; e.hash == hash {
			t.inFlight -= units
			t.requests--
			if e.count -= units; e.count == 0 {
				t.n--
				*e = t.inline[t.n]
				t.inline[t.n] = entry{}
				return true
			}
			return false
		}
	}
	n, ok := t.more[hash] // a nil map reads as empty
	if !ok {
		return false // never held: nothing to give back
	}
	t.inFlight -= units
	t.requests--
	if n > units {
		t.more[hash] = n - units
		return false
	}
	delete(t.more, hash)
	t.shrink()
	return true
}

// shrink gives back an overflow map's memory: Go maps never give back
// their buckets, so one key that stays in flight after a burst would
// otherwise pin the memory of the whole burst. A map that grew to shrinkAt
// keys is dropped once empty, and replaced by one sized to what it holds
// once that falls to 1/shrinkRatio of its peak (copying those few costs less
// than the deletions that led there). A map that stayed smaller is kept, so
// a shard whose keys hover at the inline capacity does not make a map every
// time.
func (t *table) shrink() {
	switch {
	case t.peak < shrinkAt:
	case len(t.more) == 0:
		t.more, t.peak = nil, 0
	case len(t.more) <= int(t.peak)/shrinkRatio:
		smaller := make(map[uint64]int64, len(t.more))
		for h, c := range t.more {
			smaller[h] = c
		}
		t.more, t.peak = smaller, max(int32(len(smaller)), shrinkAt) // dropped once empty
	}
}

// keys returns how many keys have units in flight.
func (t *table) keys() int { return int(t.n) + len(t.more) }

// appendCounts appends every key in flight to out.
func (t *table) appendCounts(out []KeyCount) []KeyCount {
	for _, e := range t.inline[:t.n] {
		out = append(out, KeyCount{Hash: e.hash, Count: e.count})
	}
	for h, c := range t.more {
		out = append(out, KeyCount{Hash: h, Count: c})
	}
	return out
}
