package core

import (
	"io"
	"net/http"
	"testing"

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
		if ok, _ := z.TryAcquire(req); !ok {
			t.Fatal("refused")
		}
		defer z.Release(req)
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
	if l := st.Limits[0]; l.Held != 2 || l.Units != 6 || *st.Total != 2 || *st.TotalUnits != 6 {
		t.Errorf("admin API: limit %+v, total %d (%d units); want 2 requests and 6 units in each", l, *st.Total, *st.TotalUnits)
	}
	if len(st.TopKeys) != 2 || st.TopKeys[0].Held != 5 {
		t.Errorf("admin API: top keys %+v, want the key of cost 5 first, with 5", st.TopKeys)
	}
}

// TestWaitingUnitsAndCostsThroughTheHandler: a request waiting counts its
// units as waiting until its wait ends, and each admitted request adds its
// units to the cost histogram, in metrics and the admin API.
func TestWaitingUnitsAndCostsThroughTheHandler(t *testing.T) {
	url, release := serveHandler(t, map[string]any{
		"zone":   "units-wait",
		"limits": []any{map[string]any{"name": "client", "max": 1}},
		"wait":   "30s",
	})
	zoneLabels := map[string]string{"zone": "units-wait"}
	before, _ := sample(t, "caddy_inflight_request_cost", zoneLabels)
	before = max(before, 0)
	held := fetch(t, url, "X-Hold", "1")
	done := make(chan *http.Response, 1)
	go func() {
		resp, err := http.Get(url)
		if err != nil {
			panic(err)
		}
		done <- resp
	}()
	eventually(t, "a request waits", func() bool {
		n, _ := sample(t, "caddy_inflight_waiting", zoneLabels)
		return n == 1
	})
	if units, _ := sample(t, "caddy_inflight_waiting_units", zoneLabels); units != 1 {
		t.Errorf("caddy_inflight_waiting_units %v with one request of cost 1 waiting, want 1", units)
	}
	release()
	io.Copy(io.Discard, held.Body)
	held.Body.Close()
	resp := <-done
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the waiter got %d, want 200", resp.StatusCode)
	}
	if units, _ := sample(t, "caddy_inflight_waiting_units", zoneLabels); units != 0 {
		t.Errorf("caddy_inflight_waiting_units %v once nobody waits, want 0", units)
	}
	count, sum := sample(t, "caddy_inflight_request_cost", zoneLabels)
	if count-before != 2 || sum != count {
		t.Errorf("caddy_inflight_request_cost: %v more requests, sum %v of %v; want 2 more, each of 1", count-before, sum, count)
	}
	var st ZoneState
	eachZone(func(z *zone, _ bool) {
		if z.label == "units-wait" {
			st = stateOf(z)
		}
	})
	if st.Cost.Count != int64(count) || st.Cost.Sum != int64(sum) || st.WaitingUnits != 0 {
		t.Errorf("admin API: cost %+v, waiting units %d; want the histogram's %v and %v, and 0", st.Cost, st.WaitingUnits, count, sum)
	}
}

// TestWaitingUnitsAreTheCost: a queued request counts its cost (1 at
// least, MaxCost at most) as waiting, and its end takes back exactly that.
func TestWaitingUnitsAreTheCost(t *testing.T) {
	var s unitStats
	a := newAdmission(1)
	a.waiting.zone = &s
	for _, tc := range []struct{ cost, want int64 }{{7, 7}, {0, 1}, {-3, 1}, {limiter.MaxCost + 1, limiter.MaxCost}} {
		a.req.Cost = tc.cost
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
