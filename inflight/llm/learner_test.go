package llm

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestOutputLearner: the estimate is default_output (the ceiling) until
// the 25th report, conservative until the 100th (see
// TestOutputLearnerSooner), then the 90th percentile (nearest rank) of the
// last 1,000 reports, within the ceiling, following a change of traffic
// once the window has turned over.
func TestOutputLearner(t *testing.T) {
	var l outputLearner
	for i := 1; i < learnSooner; i++ {
		l.learn("", int64(i))
		if got := l.zone.estimate(1024); got != 1024 {
			t.Fatalf("after %d reports: estimate %d, want the ceiling 1024 until %d reports", i, got, learnSooner)
		}
	}
	for i := learnSooner; i <= learnAfter; i++ {
		l.learn("", int64(i)) // reports 1..100: the 90th is 90
	}
	if got := l.zone.estimate(1024); got != 90 {
		t.Fatalf("after 100 reports of 1..100: estimate %d, want 90", got)
	}
	if got := l.zone.estimate(50); got != 50 {
		t.Fatalf("ceiling 50: estimate %d, want 50", got)
	}
	for range outputWindow {
		l.learn("", 5000)
	}
	if got := l.zone.estimate(math.MaxInt64); got != 5000 {
		t.Fatalf("after a window of 5000s: estimate %d, want 5000", got)
	}
	for i := range outputWindow {
		l.learn("", int64(i%10)*100) // 0..900, a tenth each
	}
	if got := l.zone.estimate(math.MaxInt64); got != 800 {
		t.Fatalf("after a window of 0..900 by 100: estimate %d, want 800", got)
	}
	l.learn("", math.MaxInt64) // saturates, no overflow
	for range outputWindow {
		l.learn("", 0)
	}
	if got := l.zone.estimate(1024); got != 1 {
		t.Fatalf("after a window of 0s: estimate %d, want 1 (never 0)", got)
	}
}

// TestOutputLearnerSooner: from the 25th report to the 99th, the estimate
// is the smallest report at least the 90th percentile of the outputs 9
// times in 10, whatever their distribution: the largest of 25, then a
// rank that falls towards the 90th percentile's, which is used from the
// 100th report. Checked three ways: the ranks against the binomial bound
// they are computed from, reports 1..n against those ranks, and draws from
// two distributions, where the estimate must be at or above the true 90th
// percentile in at least 90 % of 4,000 seeded trials at 25, 50 and 99
// reports.
func TestOutputLearnerSooner(t *testing.T) {
	for n := learnSooner; n < learnAfter; n++ {
		k := soonerRanks[n]
		below := func(k int) (p float64) { // P(Binomial(n, 0.9) <= k-1)
			for j := range k {
				p += binomialPMF(n, j, outputQuantile)
			}
			return p
		}
		if below(k) < soonerConfidence || below(k-1) >= soonerConfidence || k < learnedRank(learnAfter)*n/learnAfter {
			t.Fatalf("%d reports: rank %d, P = %.3f (rank %d: %.3f), want the smallest rank with P >= %v", n, k, below(k), k-1, below(k-1), soonerConfidence)
		}
	}
	if soonerRanks[learnSooner] != learnSooner || soonerRanks[learnAfter-1] != 94 {
		t.Fatalf("ranks %d at 25 reports and %d at 99, want the largest, 25, and 94", soonerRanks[learnSooner], soonerRanks[learnAfter-1])
	}
	for n := learnSooner; n < learnAfter; n++ {
		var l outputLearner
		for i := range n {
			l.learn("", int64(n-i)) // n..1: the order does not matter
		}
		if got := l.zone.estimate(1024); got != int64(soonerRanks[n]) {
			t.Fatalf("after %d reports of 1..%d: estimate %d, want %d", n, n, got, soonerRanks[n])
		}
	}

	rng := rand.New(rand.NewPCG(1, 2))
	for _, d := range []struct {
		name string
		draw func() int64
		p90  float64
	}{
		{"uniform 0..999", func() int64 { return rng.Int64N(1000) }, 900},
		{"lognormal, median 130, sigma 0.92", func() int64 { return int64(130 * math.Exp(0.92*rng.NormFloat64())) }, 130 * math.Exp(0.92*1.2816)},
	} {
		for _, n := range []int{learnSooner, 50, learnAfter - 1} {
			const trials = 4000
			above := 0
			for range trials {
				var s outputSeries
				var scratch [outputWindow]int32
				for range n {
					s.add(d.draw(), &scratch)
				}
				if float64(s.learned.Load()) >= math.Floor(d.p90) {
					above++
				}
			}
			if share := float64(above) / trials; share < soonerConfidence {
				t.Errorf("%s, %d reports: the estimate was at or above the 90th percentile in %.3f of trials, want at least %v", d.name, n, share, soonerConfidence)
			}
		}
	}
}

// TestOutputLearnerPerModel: each model learns its own estimate from its
// own reports, the zone one from all of them, and a model without an
// estimate of its own (too few reports, or never seen) counts the zone's.
func TestOutputLearnerPerModel(t *testing.T) {
	var l outputLearner
	for range learnSooner - 1 {
		l.learn("summary", 2000) // too few for an estimate of its own
	}
	for i := range learnAfter {
		l.learn("chat", 400+int64(i%10)) // 400..409: the 90th is 408
		l.learn("code", 40+int64(i%10))  // 40..49: 48
	}
	if got := l.learned("chat"); got != 408 {
		t.Errorf("chat: estimate %d, want its own 90th percentile, 408", got)
	}
	if got := l.learned("code"); got != 48 {
		t.Errorf("code: estimate %d, want its own 90th percentile, 48", got)
	}
	zone := l.zone.learned.Load()
	if zone != 2000 { // of the first 212 reports: 24 × 2000 above 188 of chat and code
		t.Fatalf("zone: estimate %d, want the 90th percentile of its reports, 2000", zone)
	}
	for _, model := range []string{"summary", "never-seen", ""} {
		if got := l.learned(model); got != zone {
			t.Errorf("model %q: estimate %d, want the zone's, %d", model, got, zone)
		}
	}
}

// TestUsageState sums up the reports against their estimates.
func TestUsageState(t *testing.T) {
	var l outputLearner
	if l.state() != nil {
		t.Fatal("no report, no learning: want no usage state")
	}
	l.count(300, 1000)
	l.count(1500, 1000)
	st := l.state()
	if st == nil || st.Reports != 2 || st.Reported != 1800 || st.Estimated != 2000 || st.Over != 1 || st.OutputEstimate != 0 {
		t.Fatalf("state %+v, want 2 reports, 1800 reported, 2000 estimated, 1 over, no output estimate", st)
	}
	l.ceiling.Store(1024)
	if st := l.state(); st.OutputEstimate != 1024 || st.Learned {
		t.Fatalf("learning, nothing learnt: state %+v, want output estimate 1024, not learned", st)
	}
}
