package inflight

import (
	"testing"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// Zones unloaded with nothing in flight are not kept, so reloads that
// rename zones do not pile them up; a zone with a request in flight is kept
// until it drains.
func TestRetiredZonesAreKeptOnlyWhileBusy(t *testing.T) {
	limits := []Limit{{Name: "client", Key: DefaultKey, Max: Max{Fixed: 1}}}
	idle, _ := loadZone(zoneID("retired-idle", true, limits, false), "retired-idle", limits, false)
	busy, _ := loadZone(zoneID("retired-busy", true, limits, false), "retired-busy", limits, false)
	req := &limiter.Request{Keys: []string{"k"}, Max: []int64{0}, Limits: &limiter.Limits{Max: []int64{1}}}
	if ok, _ := busy.TryAcquire(req); !ok {
		t.Fatal("refused")
	}
	zones.Delete(idle.id)
	zones.Delete(busy.id)
	kept := func(z *zone) bool {
		retired.Lock()
		defer retired.Unlock()
		return retired.m[z.id] == z
	}
	if kept(idle) || !kept(busy) {
		t.Fatalf("retired: idle kept %v, busy kept %v; want only the busy one", kept(idle), kept(busy))
	}
	busy.Release(req)
	other, _ := loadZone(zoneID("retired-other", true, limits, false), "retired-other", limits, false)
	zones.Delete(other.id) // any later unload drops what has drained
	if kept(busy) {
		t.Fatal("a drained zone is still kept after a later unload")
	}
}
