package core

import (
	"io"
	"sync"
)

// retired holds the zones that no loaded config uses any more but that
// still have requests in flight or waiting: a reload that renames a zone or
// changes its limits leaves the old zone's requests running against the old
// counters, and metrics and the admin API keep showing them until they end.
// A zone that comes back (a config brings its name and limits again) before
// it has drained is taken back with its counts.
var retired = struct {
	sync.Mutex
	m map[string]*zone // by zone identity
}{m: map[string]*zone{}}

// Destruct runs when the last handler using the zone is unloaded. Requests
// still in flight keep a pointer to the zone and release into it safely. A
// zone with a ledger gives back its idle allowance and keeps none. A zone
// with nothing in flight is dropped at once, and so are retired zones
// that have drained since: reloads that rename zones, with nobody reading
// metrics, must not pile up old zones, nor their per-key wait series.
func (z *zone) Destruct() error {
	z.Close()
	retired.Lock()
	defer retired.Unlock()
	forgetIdle()
	if !z.idle() {
		retired.m[z.id] = z
		return nil
	}
	z.forget()
	return nil
}

// forget drops what the zone keeps outside itself: its per-key wait
// series, and its ledger's hold on the store's client.
func (z *zone) forget() {
	z.series.forget(z.label)
	if c, ok := z.currentLedger().(io.Closer); ok {
		c.Close()
	}
}

// forgetIdle drops the retired zones that have no request left, and
// returns the others. retired must be locked.
func forgetIdle() []*zone {
	var busy []*zone
	for id, z := range retired.m {
		if z.idle() {
			delete(retired.m, id)
			z.forget()
			continue
		}
		busy = append(busy, z)
	}
	return busy
}

// takeRetired returns the retired zone of identity id, if any, no longer
// retired.
func takeRetired(id string) *zone {
	retired.Lock()
	defer retired.Unlock()
	z := retired.m[id]
	delete(retired.m, id)
	return z
}

// eachZone calls fn for every zone in use, then for every retired zone that
// still has requests in flight or waiting, forgetting the ones that have
// none.
func eachZone(fn func(z *zone, retired bool)) {
	zones.Range(func(_, v any) bool {
		fn(v.(*zone), false)
		return true
	})
	retired.Lock()
	busy := forgetIdle()
	retired.Unlock()
	for _, z := range busy {
		fn(z, true)
	}
}
