package core

import (
	"math"
	"testing"
)

// TestOutputLearner: the estimate is default_output (the ceiling) until
// the 100th report, then the 90th percentile (nearest rank) of the last
// 1,000 reports, within the ceiling, following a change of traffic once
// the window has turned over.
func TestOutputLearner(t *testing.T) {
	var l outputLearner
	for i := 1; i < learnAfter; i++ {
		l.learn(int64(i))
		if got := l.estimate(1024); got != 1024 {
			t.Fatalf("after %d reports: estimate %d, want the ceiling 1024 until %d reports", i, got, learnAfter)
		}
	}
	l.learn(learnAfter) // reports 1..100: the 90th is 90
	if got := l.estimate(1024); got != 90 {
		t.Fatalf("after 100 reports of 1..100: estimate %d, want 90", got)
	}
	if got := l.estimate(50); got != 50 {
		t.Fatalf("ceiling 50: estimate %d, want 50", got)
	}
	for range outputWindow {
		l.learn(5000)
	}
	if got := l.estimate(math.MaxInt64); got != 5000 {
		t.Fatalf("after a window of 5000s: estimate %d, want 5000", got)
	}
	for i := range outputWindow {
		l.learn(int64(i%10) * 100) // 0..900, a tenth each
	}
	if got := l.estimate(math.MaxInt64); got != 800 {
		t.Fatalf("after a window of 0..900 by 100: estimate %d, want 800", got)
	}
	l.learn(math.MaxInt64) // saturates, no overflow
	for range outputWindow {
		l.learn(0)
	}
	if got := l.estimate(1024); got != 1 {
		t.Fatalf("after a window of 0s: estimate %d, want 1 (never 0)", got)
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
