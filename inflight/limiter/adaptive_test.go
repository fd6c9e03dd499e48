package limiter

import (
	"context"
	"net/http"
	"testing"
	"time"
)

const (
	service              = 50 * time.Millisecond
	defaultTestTolerance = 0.2
	defaultTestWindow    = 250 * time.Millisecond
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// feed gives a the windows of a saturated backend with c workers and
// service time s at limit a.Limit(): every response after s × max(1,
// limit/c), starting at now; it returns the time after the last.
func feed(a *Adaptive, now time.Time, windows, c int, s time.Duration) time.Time {
	for range windows {
		l := a.Limit()
		latency := time.Duration(float64(s) * max(1, float64(l)/float64(c)))
		oneWindow(a, now, l, func(int) time.Duration { return latency })
		now = now.Add(latency + defaultTestWindow)
	}
	return now
}

// oneWindow gives a one window's responses, the i-th after latency(i),
// starting at start with inflight in flight; it reports whether the limit
// went up.
func oneWindow(a *Adaptive, start time.Time, inflight int64, latency func(i int) time.Duration) bool {
	raised := false
	for i := range fullWindowSamples {
		l := latency(i)
		done := start.Add(l + time.Duration(i)*defaultTestWindow/fullWindowSamples)
		raised = a.Observe(done, done.Add(-l), http.StatusOK, inflight)
	}
	return raised
}

func steady(int) time.Duration { return service }

func newTestAdaptive(initial int64) *Adaptive {
	return NewAdaptive(AdaptiveConfig{Min: 1, Max: 1000, Initial: initial, Tolerance: defaultTestTolerance, Window: defaultTestWindow}, epoch)
}

func TestAdaptiveSlowOutlierDoesNotCollapse(t *testing.T) {
	a := newTestAdaptive(4)
	now := feed(a, epoch, 40, 16, service)
	before := a.Limit()
	if before < 16 {
		t.Fatalf("limit %d before the outlier, want at least 16", before)
	}
	// One window in which one response took 20 × S.
	oneWindow(a, now, a.Limit(), func(i int) time.Duration {
		if i == 0 {
			return 20 * service
		}
		return service
	})
	if a.Limit() < before {
		t.Errorf("limit fell from %d to %d after one slow response", before, a.Limit())
	}
}

func TestAdaptiveLuckyFastSampleIsNotTheBaseline(t *testing.T) {
	a := newTestAdaptive(4)
	now := feed(a, epoch, 2, 16, service) // a short history: the lowest window sample is the baseline
	oneWindow(a, now, a.Limit(), func(i int) time.Duration {
		if i == 0 {
			return service / 10
		}
		return service
	})
	if b := a.Baseline(); b < service*9/10 {
		t.Errorf("baseline %v after one fast response, want about %v", b, service)
	}
}

func TestAdaptiveFailuresShrinkIt(t *testing.T) {
	a := newTestAdaptive(4)
	now := feed(a, epoch, 40, 16, service)
	if a.Limit() < 16 {
		t.Fatalf("limit %d, want at least 16", a.Limit())
	}
	// Every request fails (5xx, timeouts): the limit goes to its minimum
	// and stays there.
	for range 20 {
		for range fullWindowSamples {
			now = now.Add(defaultTestWindow / fullWindowSamples)
			a.Observe(now, now, http.StatusServiceUnavailable, a.Limit())
		}
	}
	if a.Limit() != 1 {
		t.Errorf("limit %d after every request failed, want the minimum 1", a.Limit())
	}
}

// A load that uses little of the limit neither grows it beyond twice what
// it uses nor, when the backend slows for reasons of its own, shrinks it.
func TestAdaptiveAppLimited(t *testing.T) {
	a := newTestAdaptive(4)
	now := epoch
	for range 50 {
		oneWindow(a, now, 3, steady)
		now = now.Add(service + defaultTestWindow)
	}
	if a.Limit() != 6 {
		t.Errorf("limit %d after 50 windows with 3 in flight, want 6 (twice the use)", a.Limit())
	}
	for range 10 {
		oneWindow(a, now, 2, func(int) time.Duration { return 2 * service })
		now = now.Add(2*service + defaultTestWindow)
	}
	if a.Limit() != 6 {
		t.Errorf("limit %d after slow windows with 2 of 6 in flight, want it unchanged at 6", a.Limit())
	}
}

func TestAdaptiveReportsRaise(t *testing.T) {
	a := newTestAdaptive(4)
	raised := oneWindow(a, epoch, 4, steady)
	if !raised || a.Limit() != 8 {
		t.Errorf("after a first window at the limit: raised %v, limit %d; want raised, 8 (slow start)", raised, a.Limit())
	}
}

func TestAdaptiveStaysWithinBounds(t *testing.T) {
	a := NewAdaptive(AdaptiveConfig{Min: 3, Max: 10, Initial: 4, Tolerance: 0.2, Window: defaultTestWindow}, epoch)
	now := feed(a, epoch, 20, 100, service)
	if a.Limit() != 10 {
		t.Errorf("limit %d on a large backend, want the max 10", a.Limit())
	}
	feed(a, now, 20, 1, service)
	if a.Limit() != 3 {
		t.Errorf("limit %d on a one-worker backend, want the min 3", a.Limit())
	}
}

// The zone's total reads the adaptive limit on every admission, and a
// raised limit admits the waiters it now has room for.
func TestAdaptiveTotalInZone(t *testing.T) {
	a := newTestAdaptive(2)
	lim := &Limits{Adaptive: a}
	z := NewZone(0, true, newFakeClock())
	z.Adopt(lim)
	held := []*Request{{Limits: lim}, {Limits: lim}}
	for _, r := range held {
		mustAdmit(t, z, r)
	}
	if slot, d := z.TryAcquire(&Request{Limits: lim}); slot != nil || d != TotalDim {
		t.Fatalf("third request at limit 2: admitted %v, dim %d; want refused by the total", slot, d)
	}
	w := enqueue(t, context.Background(), z, "waiter", &Request{Limits: lim}, WaitOptions{Wait: time.Hour})
	// A first window at the limit, no queue: slow start doubles it.
	raised := oneWindow(a, epoch, 2, steady)
	if !raised || a.Limit() != 4 {
		t.Fatalf("raised %v, limit %d; want raised to 4", raised, a.Limit())
	}
	z.Kick()
	select {
	case r := <-w.res:
		if r.Outcome != Admitted {
			t.Fatalf("waiter: outcome %d after the limit rose, want admitted", r.Outcome)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter still waiting after the limit rose")
	}
	if n := unitsIn(z, TotalDim); n != 3 {
		t.Fatalf("total holds %d, want 3", n)
	}
}

// Only overload statuses shrink the limit: by default an upstream's 429
// and a proxy's 502, 503, 504; an application's 500 is ignored. The
// statuses are configurable.
func TestAdaptiveOverloadStatuses(t *testing.T) {
	for _, tc := range []struct {
		overload []int
		status   int
		want     int64 // the limit of 8 after a window of such responses
	}{
		{nil, http.StatusTooManyRequests, 4},
		{nil, http.StatusBadGateway, 4},
		{nil, http.StatusServiceUnavailable, 4},
		{nil, http.StatusGatewayTimeout, 4},
		{nil, http.StatusInternalServerError, 8},
		{nil, http.StatusNotImplemented, 8},
		{[]int{500}, http.StatusInternalServerError, 4},
		{[]int{500}, http.StatusServiceUnavailable, 8},
	} {
		a := NewAdaptive(AdaptiveConfig{Min: 1, Max: 1000, Initial: 8, Tolerance: 0.2, Window: defaultTestWindow, Overload: tc.overload}, epoch)
		now := epoch
		for range fullWindowSamples {
			now = now.Add(defaultTestWindow / fullWindowSamples)
			a.Observe(now, now.Add(-service), tc.status, 8)
		}
		if got := a.Limit(); got != tc.want {
			t.Errorf("overload %v: limit %d after a window of %d, want %d", tc.overload, got, tc.status, tc.want)
		}
	}
}

// An error before any response counts only with an overload status.
func TestAdaptiveFail(t *testing.T) {
	for status, want := range map[int]int64{http.StatusGatewayTimeout: 4, http.StatusInternalServerError: 8} {
		a := NewAdaptive(AdaptiveConfig{Min: 1, Max: 1000, Initial: 8, Tolerance: 0.2, Window: defaultTestWindow}, epoch)
		now := epoch
		for range fullWindowSamples {
			now = now.Add(defaultTestWindow / fullWindowSamples)
			a.Fail(now, status, 8)
		}
		if got := a.Limit(); got != want {
			t.Errorf("limit %d after a window of errors %d, want %d", got, status, want)
		}
	}
}

// A window that does not fill closes after longWindows windows' time with
// minWindowSamples samples, not before.
func TestAdaptiveWindowClosesOnTime(t *testing.T) {
	a := newTestAdaptive(4)
	for i := range minWindowSamples {
		done := epoch.Add(defaultTestWindow + time.Duration(i)*time.Millisecond)
		a.Observe(done, epoch, http.StatusOK, 4)
	}
	if a.Limit() != 4 {
		t.Fatalf("limit %d after %d samples in its first %v, want 4: the window is still open", a.Limit(), minWindowSamples, 2*defaultTestWindow)
	}
	long := epoch.Add(longWindows * defaultTestWindow)
	if raised := a.Observe(long, epoch, http.StatusOK, 4); !raised || a.Limit() != 8 {
		t.Errorf("after %d samples in %v: raised %v, limit %d; want raised to 8 (slow start)", minWindowSamples+1, long.Sub(epoch), raised, a.Limit())
	}
}
