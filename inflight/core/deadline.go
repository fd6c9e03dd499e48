package core

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// A unit may come with a deadline: the time its client still waits for an
// answer (a gRPC request's grpc-timeout, or the HTTP handler's `deadline`).
// Its wait in the queue then ends DeadlineMargin(left) before the deadline,
// so that it is refused while its client still reads the answer, never
// admitted once its client has given up. With early refusal, a unit whose
// expected wait already exceeds what its deadline allows is refused at
// arrival instead of waiting for nothing.

const (
	// maxMargin bounds the margin kept before a deadline.
	maxMargin = 50 * time.Millisecond
	// grantTau is the time constant of a zone's grant rate: grants older
	// than a few of it no longer count.
	grantTau = 3 * time.Second
	// minGrants is how many releases a zone's rate needs before it
	// predicts anything: with fewer, no unit is refused early.
	minGrants = 4
)

// DeadlineMargin is how long before its deadline a unit's wait ends:
// 10 % of the time left, at most 50 ms. It covers the refusal's way back
// to the client and the timer's lateness; the time the request took to
// reach this handler is not known, and not covered.
func DeadlineMargin(left time.Duration) time.Duration {
	return min(maxMargin, left/10)
}

// DeadlineWait is the wait a unit with left time until its deadline may
// have, given the handler's wait: min(wait, left − margin), 0 (refused at
// once when it does not fit) when nothing is left.
func DeadlineWait(wait, left time.Duration) time.Duration {
	return max(0, min(wait, left-DeadlineMargin(left)))
}

// grantRate estimates the rate at which a zone hands out slots: an
// exponentially weighted count of its releases (each frees a slot for a
// waiter), r ← r·e^(−Δt/τ) + 1/τ with τ = grantTau, read at now as
// r·e^(−(now−last)/τ), corrected for the time it has been counting (as an
// EWMA started at zero is). So it falls while no slot frees: a stuck
// backend makes every wait look long.
type grantRate struct {
	mu    sync.Mutex
	n     int64     // releases counted
	first time.Time // of the first release
	last  time.Time // of the latest
	r     float64   // per second, at last
}

// add counts one release at now.
func (g *grantRate) add(now time.Time) {
	g.mu.Lock()
	if g.n == 0 {
		g.first = now
	} else {
		g.r *= math.Exp(-now.Sub(g.last).Seconds() / grantTau.Seconds())
	}
	g.r += 1 / grantTau.Seconds()
	g.last = now
	g.n++
	g.mu.Unlock()
}

// rate returns the grants per second at now, and false with fewer than
// minGrants releases counted.
func (g *grantRate) rate(now time.Time) (float64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n < minGrants {
		return 0, false
	}
	r := g.r * math.Exp(-now.Sub(g.last).Seconds()/grantTau.Seconds())
	// An EWMA started at zero underestimates until it has counted for a
	// few τ: divide by the weight its history has.
	if w := 1 - math.Exp(-now.Sub(g.first).Seconds()/grantTau.Seconds()); w > 0 {
		r /= w
	}
	return r, true
}

// expectedWait is the wait a unit queued behind queued others should
// expect: (queued + 1) / grants per second; false when the rate is not
// known yet. A rate of 0 expects an endless wait.
func (g *grantRate) expectedWait(queued int64, now time.Time) (time.Duration, bool) {
	r, ok := g.rate(now)
	if !ok {
		return 0, false
	}
	s := float64(queued+1) / r
	if r <= 0 || s >= float64(math.MaxInt64)/1e9 {
		return time.Duration(math.MaxInt64), true
	}
	return time.Duration(s * 1e9), true
}

// AdmitWithin is Admit for a unit whose client waits left more for an
// answer: its wait is DeadlineWait(wait, left), and with early refusal it
// is refused at once (reason timeout, waited 0) when the zone's recent
// grant rate says the units queued ahead of it will not all be served
// within that wait and a quarter more: the margin keeps the estimate's
// error from refusing units that would have been served.
func (g *Gate) AdmitWithin(ctx context.Context, t *Ticket, class, weight string, left time.Duration) Verdict {
	return g.admit(ctx, t, class, weight, left, true)
}

// deadlineOpt bounds opt's wait by a deadline left away.
func (g *Gate) deadlineOpt(opt *limiter.WaitOptions, left time.Duration) {
	if opt.Wait <= 0 {
		return
	}
	opt.Wait = DeadlineWait(opt.Wait, left)
	if g.early && opt.Wait > 0 {
		allowed := opt.Wait
		opt.Refuse = func(queued int64) bool {
			exp, ok := g.zone.grants.expectedWait(queued, g.zone.Clock().Now())
			return ok && exp > allowed+allowed/4
		}
	}
}
