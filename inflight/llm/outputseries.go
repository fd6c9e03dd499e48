package llm

import (
	"math"
	"slices"
	"sync/atomic"
)

// The output estimate learnt from one series of reported output counts (a
// zone's, or one model's): from the learnSooner-th report, a conservative
// one, the smallest report that is at least the outputQuantile of the
// outputs the reports come from with probability soonerConfidence; from
// the learnAfter-th, the outputQuantile (nearest rank) of the last
// outputWindow reports, recomputed every relearnEvery reports.
const (
	outputWindow     = 1000
	learnSooner      = 25
	learnAfter       = 100
	relearnEvery     = 16
	outputQuantile   = 0.9
	soonerConfidence = 0.9
)

// soonerRanks gives, for n reports from learnSooner to learnAfter-1, the
// rank (1 for the smallest) of the conservative estimate among them: the
// smallest k such that the k-th smallest of n reports is at least the
// outputQuantile of their distribution with probability soonerConfidence,
// whatever the distribution. That is the smallest k with
// P(Binomial(n, outputQuantile) <= k-1) >= soonerConfidence, as the k-th
// smallest is below the quantile only if k reports or more are. With 25
// reports it is the largest (1 - 0.9^25 = 0.93); the rank falls towards
// the 90th percentile's as reports come in: at 99 reports, the 94th.
var soonerRanks = func() (ranks [learnAfter]int) {
	for n := learnSooner; n < learnAfter; n++ {
		cdf := 0.0
		for k := 1; k <= n; k++ {
			cdf += binomialPMF(n, k-1, outputQuantile)
			if ranks[n] = k; cdf >= soonerConfidence {
				break
			}
		}
	}
	return ranks
}()

// binomialPMF is P(Binomial(n, p) = k).
func binomialPMF(n, k int, p float64) float64 {
	ln, _ := math.Lgamma(float64(n + 1))
	lk, _ := math.Lgamma(float64(k + 1))
	lnk, _ := math.Lgamma(float64(n - k + 1))
	return math.Exp(ln - lk - lnk + float64(k)*math.Log(p) + float64(n-k)*math.Log1p(-p))
}

// learnedRank is the rank, among n sorted reports, of the estimate.
func learnedRank(n int) int {
	if n < learnAfter {
		return soonerRanks[n]
	}
	return int(math.Ceil(outputQuantile * float64(n))) // nearest rank
}

// outputSeries is the last outputWindow output counts of one series, and
// the estimate learnt from them. The window is fixed-size: its memory does
// not grow with the traffic. Its owner's mutex guards all but learned.
type outputSeries struct {
	recent [outputWindow]int32 // output counts, a ring; saturated at MaxInt32
	n      int                 // counts in recent, up to outputWindow
	next   int                 // where the next count goes
	since  int                 // counts since the estimate was computed
	total  int64               // counts ever added

	learned atomic.Int64 // 0 until learnSooner counts
}

// add adds one output count to the window, and recomputes the estimate
// when due, sorting in scratch.
func (s *outputSeries) add(output int64, scratch *[outputWindow]int32) {
	s.recent[s.next] = int32(min(output, math.MaxInt32))
	s.next = (s.next + 1) % outputWindow
	s.n = min(s.n+1, outputWindow)
	s.total++
	s.since++
	if s.n < learnSooner || (s.n > learnAfter && s.since < relearnEvery) {
		return
	}
	s.since = 0
	sorted := scratch[:s.n]
	copy(sorted, s.recent[:s.n])
	slices.Sort(sorted)
	s.learned.Store(max(int64(sorted[learnedRank(s.n)-1]), 1))
}

// estimate is the output estimate with the given ceiling: the learned
// one, within it, or the ceiling until learnt.
func (s *outputSeries) estimate(ceiling int64) int64 {
	if e := s.learned.Load(); e > 0 {
		return min(e, ceiling)
	}
	return ceiling
}
