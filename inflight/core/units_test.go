package core

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// sample returns the value of the series of the metric name whose labels
// include want (a histogram: its count, and its sum), or -1 if none.
func sample(t *testing.T, name string, want map[string]string) (value, sum float64) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(stateCollector{}, requestCost)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			n := 0
			for _, l := range m.GetLabel() {
				if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
					n++
				}
			}
			if n == len(want) {
				if h := m.GetHistogram(); h != nil {
					return float64(h.GetSampleCount()), h.GetSampleSum()
				}
				return m.GetGauge().GetValue(), 0
			}
		}
	}
	return -1, 0
}

// TestRequestSeriesCountRequestsAndUnitsBeside: requests of cost 5 and 1
// in flight are 2 requests and 6 units, per limit and in the total, in
// metrics and in the admin API; the busiest key is shown with its units.
func TestRequestSeriesCountRequestsAndUnitsBeside(t *testing.T) {
	limits := []Limit{{Name: "tenant", Key: "{tenant}", Max: Max{Fixed: 10}}}
	z, _ := loadZone(zoneID("units", true, limits, true), "units", limits, true)
	defer zones.Delete(z.id)
	lim := &limiter.Limits{Max: []int64{10}, Total: 20}
	big := &limiter.Request{Keys: []string{"a"}, Max: []int64{0}, Cost: 5, Limits: lim}
	small := &limiter.Request{Keys: []string{"b"}, Max: []int64{0}, Limits: lim}
	for _, req := range []*limiter.Request{big, small} {
		slot, _ := z.TryAcquire(req)
		if slot == nil {
			t.Fatal("refused")
		}
		defer slot.Release()
	}
	for _, limit := range []string{"tenant", "total"} {
		labels := map[string]string{"zone": "units", "limit": limit}
		requests, _ := sample(t, "caddy_inflight_requests", labels)
		units, _ := sample(t, "caddy_inflight_units", labels)
		if requests != 2 || units != 6 {
			t.Errorf("limit %s: caddy_inflight_requests %v, caddy_inflight_units %v; want 2 and 6", limit, requests, units)
		}
	}
	st := stateOf(z)
	if l := st.Limits[0]; l.Requests != 2 || l.Units != 6 || *st.Total != 2 || *st.TotalUnits != 6 {
		t.Errorf("admin API: limit %+v, total %d (%d units); want 2 requests and 6 units in each", l, *st.Total, *st.TotalUnits)
	}
	if len(st.TopKeys) != 2 || st.TopKeys[0].InFlight != 5 {
		t.Errorf("admin API: top keys %+v, want the key of cost 5 first, with 5", st.TopKeys)
	}
}

// TestWaitingUnitsAndCostsThroughTheGate: with costs, a unit waiting
// counts its units as waiting until its wait ends, and each admitted unit
// adds its units to the cost histogram, in metrics and the admin API.
func TestWaitingUnitsAndCostsThroughTheGate(t *testing.T) {
	g := testGateOn(t, "units-wait", &Config{
		Zone:   "units-wait",
		Limits: []Limit{{Name: "client", Key: "{client}", Max: Max{Fixed: 2}}},
		Wait:   caddy.Duration(30 * time.Second),
	}, Edge{Costs: true})
	zoneLabels := map[string]string{"zone": "units-wait"}
	before, _ := sample(t, "caddy_inflight_request_cost", zoneLabels)
	before = max(before, 0)
	held, waiter := g.newTicket("k"), g.newTicket("k")
	held.Req.Cost, waiter.Req.Cost = 2, 2
	if v := g.Admit(context.Background(), held, "", ""); v.Outcome != limiter.Admitted {
		t.Fatalf("the first unit: %+v, want admitted", v)
	}
	done := make(chan Verdict, 1)
	go func() { done <- g.Admit(context.Background(), waiter, "", "") }()
	// The queue counts the unit before its units are counted as waiting
	// (once it is queued, outside the queue's lock): wait for both.
	eventually(t, "one unit of cost 2 waits: caddy_inflight_waiting 1 and caddy_inflight_waiting_units 2", func() bool {
		n, _ := sample(t, "caddy_inflight_waiting", zoneLabels)
		units, _ := sample(t, "caddy_inflight_waiting_units", zoneLabels)
		return n == 1 && units == 2
	})
	g.Release(held)
	if v := <-done; v.Outcome != limiter.Admitted {
		t.Fatalf("the waiter: %+v, want admitted", v)
	}
	g.Release(waiter)
	if units, _ := sample(t, "caddy_inflight_waiting_units", zoneLabels); units != 0 {
		t.Errorf("caddy_inflight_waiting_units %v once nobody waits, want 0", units)
	}
	count, sum := sample(t, "caddy_inflight_request_cost", zoneLabels)
	if count-before != 2 || sum != 2*count {
		t.Errorf("caddy_inflight_request_cost: %v more units, sum %v of %v; want 2 more, each of 2", count-before, sum, count)
	}
	st := stateOf(g.zone)
	if st.Cost == nil || st.Cost.Count != int64(count) || st.Cost.Sum != int64(sum) || st.WaitingUnits != 0 {
		t.Errorf("admin API: cost %+v, waiting units %d; want the histogram's %v and %v, and 0", st.Cost, st.WaitingUnits, count, sum)
	}
}

// TestWaitingUnitsAreTheCost: a queued request counts its cost (1 at
// least, MaxCost at most) as waiting, and its end takes back exactly that.
func TestWaitingUnitsAreTheCost(t *testing.T) {
	var s unitStats
	a := newTicket(1)
	a.waiting.zone = &s
	for _, tc := range []struct{ cost, want int64 }{{7, 7}, {0, 1}, {-3, 1}, {limiter.MaxCost + 1, limiter.MaxCost}} {
		a.Req.Cost = tc.cost
		a.onQueued()
		if got := s.waiting.Load(); got != tc.want {
			t.Errorf("cost %d: %d units waiting, want %d", tc.cost, got, tc.want)
		}
		a.waiting.end()
		a.waiting.end() // a second end takes nothing
		if got := s.waiting.Load(); got != 0 {
			t.Errorf("cost %d: %d units waiting after the wait, want 0", tc.cost, got)
		}
	}
}

// TestWithoutCostUnitsAreRequests: without costs every unit holds one
// unit: the zone has no cost histogram and the admin API no cost, while
// its units in flight are counted as with costs.
func TestWithoutCostUnitsAreRequests(t *testing.T) {
	g := testGate(t, "units-none", &Config{
		Zone:   "units-none",
		Limits: []Limit{{Name: "client", Key: "{client}", Max: Max{Fixed: 1}}},
	})
	held := g.newTicket("k")
	if v := g.Admit(context.Background(), held, "", ""); v.Outcome != limiter.Admitted {
		t.Fatalf("the first unit: %+v, want admitted", v)
	}
	defer g.Release(held)
	if count, _ := sample(t, "caddy_inflight_request_cost", map[string]string{"zone": "units-none"}); count != -1 {
		t.Errorf("caddy_inflight_request_cost of a zone without cost: %v units, want no series", count)
	}
	st := stateOf(g.zone)
	if l := st.Limits[0]; st.Cost != nil || l.Requests != 1 || l.Units != 1 {
		t.Errorf("admin API: cost %+v, limit %+v; want no cost, 1 unit held", st.Cost, l)
	}
}

// TestRefusalsCountFromTheZonesStart: a zone made under a name that
// refused before (its limits changed on reload) counts its own refusals
// only, as the metric counts them.
func TestRefusalsCountFromTheZonesStart(t *testing.T) {
	rejectedTotal.WithLabelValues("refusals", "client", reasonFull).Add(2)
	limits := []Limit{{Name: "client", Key: "{client}", Max: Max{Fixed: 1}}}
	z, _ := loadZone(zoneID("refusals", true, limits, false), "refusals", limits, false)
	defer zones.Delete(z.id)
	z.startStats()
	if got := z.refusedByReason(); len(got) != 0 {
		t.Fatalf("a new zone: refused %v, want none", got)
	}
	rejectedTotal.WithLabelValues("refusals", "client", reasonFull).Inc()
	rejectedTotal.WithLabelValues("refusals", totalName, reasonQueueFull).Inc()
	if got := z.refusedByReason(); len(got) != 2 || got[reasonFull] != 1 || got[reasonQueueFull] != 1 {
		t.Fatalf("refused %v, want full 1 and queue_full 1", got)
	}
}

// TestStateOfACostZoneIsInUnits: the state the live page reads gives, for
// a zone whose units have costs, the units in flight beside the requests
// and the cap in units, and says the zone has costs: 3 requests of cost
// 500 under a total of 2000 are 1500 units of 2000.
func TestStateOfACostZoneIsInUnits(t *testing.T) {
	g := testGateOn(t, "units-page", &Config{Zone: "units-page", Total: 2000}, Edge{Costs: true})
	for i := range 3 {
		tk := g.newTicket()
		tk.Req.Cost = 500
		if v := g.Admit(context.Background(), tk, "", ""); v.Outcome != limiter.Admitted {
			t.Fatalf("unit %d: %+v, want admitted", i, v)
		}
		defer g.Release(tk)
	}
	w := httptest.NewRecorder()
	if err := ServeState(w); err != nil {
		t.Fatal(err)
	}
	var state struct {
		Zones []struct {
			Zone       string
			Total      int64           `json:"total"`
			TotalUnits int64           `json:"total_units"`
			TotalMax   int64           `json:"total_max"`
			Cost       json.RawMessage `json:"cost"`
		}
	}
	if err := json.Unmarshal(w.Body.Bytes(), &state); err != nil {
		t.Fatal(err)
	}
	for _, z := range state.Zones {
		if z.Zone != "units-page" {
			continue
		}
		if z.Total != 3 || z.TotalUnits != 1500 || z.TotalMax != 2000 || string(z.Cost) != `{"count":3,"sum":1500}` {
			t.Fatalf("state: total %d, total_units %d, total_max %d, cost %s; want 3, 1500, 2000 and 3 costs of 1500 units", z.Total, z.TotalUnits, z.TotalMax, z.Cost)
		}
		return
	}
	t.Fatalf("no zone units-page in %s", w.Body)
}
