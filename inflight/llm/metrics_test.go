package llm

import (
	"os"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetricFamiliesAsRegistered: the usage families reach a config's
// registry as testdata/metric_families.txt shows them: names, help texts,
// types, label names and buckets. The families are the process's: the
// test empties them first and after (no test of this package runs in
// parallel).
func TestMetricFamiliesAsRegistered(t *testing.T) {
	empty := func() {
		reportedTokens.Reset()
		usageRatio.Reset()
	}
	empty()
	t.Cleanup(empty)
	m := usageMetricsFor("declared")
	m.input.Add(3)
	m.cached.Add(2)
	m.output.Add(1)
	m.ratio.Observe(1)
	reg := prometheus.NewRegistry()
	for _, c := range Collectors() {
		reg.MustRegister(c)
	}
	golden, err := os.Open("testdata/metric_families.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer golden.Close()
	if err := testutil.GatherAndCompare(reg, golden); err != nil {
		t.Error(err)
	}
}
