package limiter

import (
	"runtime"
	"strconv"
	"testing"
)

func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// TestMillionKeysComeAndGo holds 1,000,000 distinct keys in flight at once,
// then releases them: each active key must cost at most 128 bytes of the
// zone's memory, and afterwards the zone must hold no key and the live heap
// must be back within 1 MiB of where it started.
func TestMillionKeysComeAndGo(t *testing.T) {
	const n = 1_000_000
	lim := &Limits{Max: []int64{1}}
	reqs := make([]Request, n) // the requests' own memory, not the zone's
	keys := make([]string, n)
	for i := range reqs {
		keys[i] = "2001:db8::" + strconv.FormatInt(int64(i), 16)
		reqs[i] = Request{Keys: keys[i : i+1], Max: []int64{0}, Limits: lim}
	}
	z := NewZone(1, false, nil)
	before := liveHeap()
	for i := range reqs {
		if slot, _ := z.TryAcquire(&reqs[i]); slot == nil {
			t.Fatalf("key %d refused", i)
		}
	}
	during := liveHeap()
	perKey := float64(during-before) / n
	t.Logf("zone memory with %d keys in flight: %.1f MiB, %.1f bytes per key", n, float64(during-before)/(1<<20), perKey)
	if perKey > 128 {
		t.Errorf("an active key costs %.1f bytes, want at most 128", perKey)
	}
	for i := range reqs {
		reqs[i].slot.Release()
	}
	after := liveHeap()
	t.Logf("after release: heap %+.1f KiB from the start", float64(after-before)/1024)
	if keysIn(z, 0) != 0 || unitsIn(z, 0) != 0 {
		t.Fatalf("after release: %d keys, %d held", keysIn(z, 0), unitsIn(z, 0))
	}
	if after-before > 1<<20 {
		t.Errorf("live heap %d bytes above the start after every key left, want within 1 MiB", after-before)
	}
	runtime.KeepAlive(reqs)
	runtime.KeepAlive(z)
}

// TestMemoryComesBackWhileKeysStay: after a burst of 500,000 keys leaves,
// the heap returns near where it started even though a few keys that came
// with the burst are still in flight (each pinned its shard's map before).
func TestMemoryComesBackWhileKeysStay(t *testing.T) {
	const n, stay = 512_000, 64
	lim := &Limits{Max: []int64{1}}
	reqs := make([]Request, n)
	for i := range reqs {
		reqs[i] = Request{Keys: []string{"burst-" + strconv.Itoa(i)}, Max: []int64{0}, Limits: lim}
	}
	z := NewZone(1, false, nil)
	before := liveHeap()
	for i := range reqs {
		if slot, _ := z.TryAcquire(&reqs[i]); slot == nil {
			t.Fatalf("key %d refused", i)
		}
	}
	during := liveHeap()
	for i := range reqs { // the ones that stay came mid-burst, into overflow maps
		if i%(n/stay) != n/stay/2 {
			reqs[i].slot.Release()
		}
	}
	after := liveHeap()
	t.Logf("burst: +%.1f MiB; after it left with %d keys staying: %+.1f KiB", float64(during-before)/(1<<20), stay, float64(after-before)/1024)
	if keysIn(z, 0) != stay {
		t.Fatalf("%d keys in flight, want %d", keysIn(z, 0), stay)
	}
	if after-before > 1<<20 {
		t.Errorf("live heap %.1f MiB above the start with %d keys staying, want within 1 MiB", float64(after-before)/(1<<20), stay)
	}
	runtime.KeepAlive(reqs)
	runtime.KeepAlive(z)
}
