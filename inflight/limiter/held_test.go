package limiter

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/internal/fleetref"
)

// twoCaps is the scenario of a request that needs two keyed caps (tenant T
// and client C, caps 10, each held by 9 requests of cost 1) while small
// requests keep arriving for T and C. One round is a service time, in which
// the requests holding T (even rounds) or C (odd rounds) end and as many
// newcomers arrive. A store under test says how requests are tried,
// released, and how a round passes.
type twoCaps struct {
	lim     *Limits
	try     func(*Request) bool // admits at once, or refuses
	release func(*Request)
	waiting func() int64
	pass    func() // a service time passes
	onT     []*Request
	onC     []*Request
	n       int
}

func newTwoCaps() *twoCaps { return &twoCaps{lim: &Limits{Max: []int64{10, 10}}} }

// arrive tries a cost-1 request for tenant and client ("": one of its own).
func (s *twoCaps) arrive(tenant, client string) *Request {
	s.n++
	if tenant == "" {
		tenant = fmt.Sprint("tenant", s.n)
	}
	if client == "" {
		client = fmt.Sprint("client", s.n)
	}
	if r := req(s.lim, tenant, client); s.try(r) {
		return r
	}
	return nil
}

// fill has 9 requests hold T and 9 hold C.
func (s *twoCaps) fill() {
	for range 9 {
		s.onT = append(s.onT, s.arrive("T", ""))
		s.onC = append(s.onC, s.arrive("", "C"))
	}
}

// roundsUntilAdmitted plays up to rounds rounds and returns the round in
// which nobody waits any more, or -1.
func (s *twoCaps) roundsUntilAdmitted(rounds int) int {
	for round := range rounds {
		s.pass()
		ending, tenant, client := &s.onT, "T", ""
		if round%2 == 1 {
			ending, tenant, client = &s.onC, "", "C"
		}
		held := *ending
		*ending = nil
		for _, r := range held {
			if r != nil {
				s.release(r)
			}
			if r := s.arrive(tenant, client); r != nil {
				*ending = append(*ending, r)
			}
		}
		if s.waiting() == 0 {
			return round + 1
		}
	}
	return -1
}

// The request needing two caps is admitted within a few service times:
// the room it was refused in stays held for it until both have drained.
// Time is the zone's fake clock.
func TestWaiterNeedingTwoCapsIsNotPassedForEver(t *testing.T) {
	const rounds, service = 50, time.Second
	clock := newFakeClock()
	z := NewZone(2, false, clock)
	s := newTwoCaps()
	s.try = func(r *Request) bool { slot, _ := z.TryAcquire(r); return slot != nil }
	s.release = func(r *Request) { r.slot.Release() }
	s.waiting = func() int64 { return waitingIn(z) }
	s.pass = func() { clock.Advance(service) }
	s.fill()
	big := costly(s.lim, 10, "T", "C")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := enqueue(t, ctx, z, "big", big, WaitOptions{Wait: time.Hour})

	admittedIn := s.roundsUntilAdmitted(rounds)
	if admittedIn < 0 {
		t.Fatalf("cost-10 request needing T and C still waits after %d service times (T holds %d, C holds %d units)",
			rounds, unitsOfKey(z, 0, "T"), unitsOfKey(z, 1, "C"))
	}
	res := <-w.res
	if res.Outcome != Admitted || admittedIn > 3 || res.Waited > 3*service {
		t.Fatalf("cost-10 request: outcome %d after %d rounds (%s), want admitted within 3 service times", res.Outcome, admittedIn, res.Waited)
	}
	t.Logf("cost-10 request needing two caps admitted after %d service times", admittedIn)
	if unitsOfKey(z, 0, "T") != 10 || unitsOfKey(z, 1, "C") != 10 {
		t.Fatalf("with it admitted: T holds %d, C %d units; want 10 and 10 (it alone)", unitsOfKey(z, 0, "T"), unitsOfKey(z, 1, "C"))
	}
}

// The same with a ledger: two zones of one fleet, each admitting within
// allowances; the big request waits at one of them, the small ones come
// at the other, and the fleet's caps hold for both.
func TestFleetWaiterNeedingTwoCapsIsNotPassedForEver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rounds, service = 50, time.Second
		fleet := fleetref.NewFleet()
		here, there := NewZone(2, false, nil), NewZone(2, false, nil)
		here.SetLedger(fleet.Join())
		there.SetLedger(fleet.Join())
		t.Cleanup(func() { closeZone(t, here) })
		t.Cleanup(func() { closeZone(t, there) })
		s := newTwoCaps()
		s.try = func(r *Request) bool {
			return there.Acquire(context.Background(), r, WaitOptions{}).Outcome == Admitted
		}
		s.release = func(r *Request) { r.slot.Release(); synctest.Wait() }
		s.waiting = func() int64 { synctest.Wait(); return waitingIn(here) }
		s.pass = func() { time.Sleep(service) }
		s.fill()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan Result, 1)
		big := costly(s.lim, 10, "T", "C")
		go func() { done <- here.Acquire(ctx, big, WaitOptions{Wait: time.Hour}) }()
		synctest.Wait()

		admittedIn := s.roundsUntilAdmitted(rounds)
		if admittedIn < 0 {
			t.Fatalf("cost-10 request needing T and C still waits after %d service times", rounds)
		}
		res := <-done
		if res.Outcome != Admitted || admittedIn > 3 {
			t.Fatalf("cost-10 request: outcome %d after %d rounds, want admitted within 3 service times", res.Outcome, admittedIn)
		}
		t.Logf("cost-10 request needing two caps admitted across the fleet after %d service times", admittedIn)
		big.slot.Release()
		for _, r := range append(s.onT, s.onC...) {
			if r != nil {
				r.slot.Release()
			}
		}
		time.Sleep(keepUnused + 2*linger) // idle allowance goes back
		for _, name := range []string{setName(0, "T"), setName(1, "C")} {
			if held := fleet.Level(name); held != 0 {
				t.Fatalf("after every release: the fleet counts %d units in %s, want 0", held, name)
			}
		}
	})
}

// When aging makes another waiter the best on a constraint whose room is
// held, that waiter is served as soon as a try meets its hold: a normal
// request F holds tenant x's room while it waits for client y; a high one,
// G, that needs x arrived later; once G has overtaken F in the queue order
// and y frees, G is admitted (x is empty), and F after it, rather than
// both waiting for each other's hold.
func TestHeldRoomGoesToWhoeverBecameBest(t *testing.T) {
	clock := newFakeClock()
	z := NewZone(2, false, clock)
	lim := &Limits{Max: []int64{1, 1}}
	onX, onY := req(lim, "x", "c0"), req(lim, "t0", "y")
	mustAdmit(t, z, onX)
	mustAdmit(t, z, onY)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opt := WaitOptions{Wait: time.Hour, Class: Normal}
	f := enqueue(t, ctx, z, "F", req(lim, "x", "y"), opt) // refused by x
	onX.slot.Release()                                    // F is refused by y now, and holds x
	clock.Advance(60 * time.Second)
	opt.Class = High
	g := enqueue(t, ctx, z, "G", req(lim, "x", "c1"), opt) // refused by x's hold: F is better
	clock.Advance(40 * time.Second)                        // G has overtaken F
	onY.slot.Release()                                     // serves y, then x: a release grants synchronously
	if n := waitingIn(z); n != 1 {
		t.Fatalf("after y freed, with x empty: %d waiting, want 1 (G admitted): F and G wait for each other's hold", n)
	}
	if res := <-g.res; res.Outcome != Admitted {
		t.Fatalf("G: outcome %d, want admitted", res.Outcome)
	}
	g.req.slot.Release()
	if res := <-f.res; res.Outcome != Admitted {
		t.Fatalf("F: outcome %d, want admitted once G left x", res.Outcome)
	}
	f.req.slot.Release()
}
