package core

import (
	"os"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/caddy-inflight/caddy-inflight/inflight/storestatus"
)

// TestMetricFamiliesAsRegistered: the families core and storestatus
// declare reach a config's registry as testdata/metric_families.txt shows
// them: names, help texts, types, label names and buckets. Each family
// gets one series in a zone of the test's own, and only that zone's
// series are compared, whatever other tests left.
func TestMetricFamiliesAsRegistered(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := registerMetrics(reg, nil); err != nil {
		t.Fatal(err)
	}
	const zone = "declared"
	rejectedTotal.WithLabelValues(zone, "client", reasonFull).Inc()
	waitSeconds.WithLabelValues(zone, "admitted").Observe(0)
	requestCost.WithLabelValues(zone).Observe(1)
	keyRequests.WithLabelValues(zone, "client", "k").Set(1)
	keyWaitSeconds.WithLabelValues(zone, "client", "k", "admitted").Observe(0)
	keyGivenSeconds.WithLabelValues(zone, "client", "k").Add(1)
	storestatus.Observe("declared", zone, "acquire", 0, true)
	t.Cleanup(func() {
		for _, v := range []interface{ DeletePartialMatch(prometheus.Labels) int }{rejectedTotal, waitSeconds, requestCost, keyRequests, keyWaitSeconds, keyGivenSeconds} {
			v.DeletePartialMatch(prometheus.Labels{"zone": zone})
		}
	})
	ofZone := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		families, err := reg.Gather()
		for _, f := range families {
			f.Metric = slices.DeleteFunc(f.Metric, func(m *dto.Metric) bool {
				return !slices.ContainsFunc(m.Label, func(l *dto.LabelPair) bool { return l.GetName() == "zone" && l.GetValue() == zone })
			})
		}
		return slices.DeleteFunc(families, func(f *dto.MetricFamily) bool { return len(f.Metric) == 0 }), err
	})
	golden, err := os.Open("testdata/metric_families.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer golden.Close()
	if err := testutil.GatherAndCompare(ofZone, golden); err != nil {
		t.Error(err)
	}
}
