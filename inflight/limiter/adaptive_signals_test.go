//go:build !race

package limiter

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// Clients hammering a path on which the application answers 500 at once
// do not shrink the limit for everyone: a 500 is the application's error,
// not overload. The other clients' throughput stays within 90 % of what a
// fixed total of c gives them beside the same error clients.
func TestAdaptiveApplicationErrorsAreNotOverload(t *testing.T) {
	const c = 16
	sc := scenario{workers: c, service: service, duration: 60 * time.Second, clients: 3 * c / 2,
		errorClients: 2, errorService: time.Millisecond, errorStatus: http.StatusInternalServerError, seed: 1}
	o, hand := simulate(sc, newOurs(4)), simulate(sc, fixed(c))
	t.Logf("limit settled %g (%d to %d), throughput %.3f; total %d: %.3f", o.settled, o.minLimit, o.maxLimit, o.throughput, c, hand.throughput)
	if o.throughput < 0.9*hand.throughput {
		t.Errorf("throughput %.3f of c/S beside clients of a 500 path, want at least 0.9 × %.3f (total %d)", o.throughput, hand.throughput, c)
	}
	if o.settled < c {
		t.Errorf("limit settled at %g beside clients of a 500 path, want at least c = %d", o.settled, c)
	}
}

// A 4 s burst in which half the responses are an application's 500 leaves
// the limit where it is without the burst; one of 503 (overload) shrinks
// it, and it is back within a few seconds after.
func TestAdaptiveFailureBurst(t *testing.T) {
	const c = 16
	sc := scenario{workers: c, service: service, duration: 60 * time.Second, clients: 2 * c, from: 30 * time.Second, seed: 1}
	quiet := simulate(sc, newOurs(4))
	sc.failFrom, sc.failTo, sc.failShare = 30*time.Second, 34*time.Second, 0.5
	for _, status := range []int{http.StatusInternalServerError, http.StatusServiceUnavailable} {
		sc.failStatus = status
		o := simulate(sc, newOurs(4))
		t.Logf("%d: limit down to %d (%d without the burst), back after %v", status, o.minLimit, quiet.minLimit, o.recovered)
		switch {
		case status == http.StatusInternalServerError && o.minLimit < quiet.minLimit:
			t.Errorf("%d: limit fell to %d, want at least %d as without the burst: not an overload status", status, o.minLimit, quiet.minLimit)
		case status == http.StatusServiceUnavailable && (o.recovered < 0 || o.recovered > 10*time.Second):
			t.Errorf("%d: limit back %v after the burst, want within 10s", status, o.recovered)
		}
	}
}

// Slow readers (a long service time, so a window sees few responses) from a
// cold start: the limit leaves initial and reaches the backend's capacity
// within a bounded time, and settles in its region: [c, 1.5c] when the
// clients overload it, up to twice what they use when they do not; the
// backend stays busy (90 %: with a few samples a window, a limit that dips
// below c for a window costs more than with many).
func TestAdaptiveSlowReaders(t *testing.T) {
	const slow = 2 * time.Second
	for _, tc := range []struct{ c, clients int }{{16, 16}, {8, 16}, {16, 32}} {
		sc := scenario{workers: tc.c, service: slow, duration: 120 * time.Second, clients: tc.clients, reach: int64(tc.c), seed: 1}
		o := simulate(sc, newOurs(4))
		name := fmt.Sprintf("c=%d, %d clients, S=%v", tc.c, tc.clients, slow)
		t.Logf("%s: limit reached c after %v, settled %g (%d to %d), throughput %.3f", name, o.reached, o.settled, o.minLimit, o.maxLimit, o.throughput)
		if o.reached < 0 || o.reached > 15*time.Second {
			t.Errorf("%s: limit reached c after %v, want within 15s", name, o.reached)
		}
		hi := 1.5 * float64(tc.c)
		if tc.clients <= tc.c {
			hi = 2 * float64(tc.clients)
		}
		if o.settled < float64(tc.c) || o.settled > hi {
			t.Errorf("%s: limit settled at %g, want within [%d, %g]", name, o.settled, tc.c, hi)
		}
		if o.throughput < 0.9 {
			t.Errorf("%s: throughput %.3f of c/S, want at least 0.9", name, o.throughput)
		}
	}
}
