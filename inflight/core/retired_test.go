package core

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// Zones unloaded with nothing in flight are not kept, so reloads that
// rename zones do not pile them up; a zone with a request in flight is kept
// until it drains. The per-key wait series of each go with it.
func TestRetiredZonesAreKeptOnlyWhileBusy(t *testing.T) {
	limits := []Limit{{Name: "client", Key: "{http.vars.client_ip}", Max: Max{Fixed: 1}}}
	idle, _ := loadZone(zoneID("retired-idle", true, limits, false), "retired-idle", limits, false)
	busy, _ := loadZone(zoneID("retired-busy", true, limits, false), "retired-busy", limits, false)
	req := &limiter.Request{Keys: []string{"k"}, Max: []int64{0}, Limits: &limiter.Limits{Max: []int64{1}}}
	slot, _ := busy.TryAcquire(req)
	if slot == nil {
		t.Fatal("refused")
	}
	for _, z := range []*zone{idle, busy} {
		h := &Gate{cfg: &Config{Limits: limits, PerKeyMetrics: true}, label: z.label}
		a := newTicket(1)
		a.Req.Keys[0] = "k"
		z.series.waited(h, a, limiter.Admitted, time.Second, time.Now())
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
	if n, m := keyWaitSeriesOf(t, idle.label), keyWaitSeriesOf(t, busy.label); n != 0 || m != 1 {
		t.Fatalf("per-key wait series: %d of the dropped zone, %d of the busy one; want 0 and 1", n, m)
	}
	slot.Release()
	other, _ := loadZone(zoneID("retired-other", true, limits, false), "retired-other", limits, false)
	zones.Delete(other.id) // any later unload drops what has drained
	if kept(busy) {
		t.Fatal("a drained zone is still kept after a later unload")
	}
	if n := keyWaitSeriesOf(t, busy.label); n != 0 {
		t.Fatalf("%d per-key wait series of the drained zone left, want none", n)
	}
}

// keyWaitSeriesOf counts the per-key wait histograms of a zone.
func keyWaitSeriesOf(t *testing.T, zone string) int {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(keyWaitSeconds)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "zone" && l.GetValue() == zone {
					n++
				}
			}
		}
	}
	return n
}
