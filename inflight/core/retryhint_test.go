package core

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// TestRetryHintsSpaceRefusedClients: in virtual time, a zone that frees a
// slot every 100 ms gives no hint before 4 releases, then tells refused
// requests one after another to come back 100, 200, 300 ms later (± the
// 10 % jitter): one freed slot each, not all at once; never past the
// ceiling, which leaves the schedule where it was; and once the told times
// have passed, the next hint starts from the present again.
func TestRetryHintsSpaceRefusedClients(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := testGateOn(t, "retry-hint", &Config{Zone: "retry-hint", Limits: []Limit{{Name: "client", Key: "{client}", Max: Max{Fixed: 1}}}}, Edge{RetryHints: true})
		release := func() {
			tk := g.newTicket("k")
			if g.Admit(context.Background(), tk, "", "").Outcome != limiter.Admitted {
				t.Fatal("want admitted")
			}
			time.Sleep(100 * time.Millisecond)
			g.Release(tk)
		}
		for range 3 {
			release()
		}
		if d, ok := g.RetryHint(time.Second); ok {
			t.Fatalf("a hint (%v) after 3 releases, want none before 4", d)
		}
		for range 30 { // 3 s: the rate's history weighs in
			release()
		}
		for i, want := range []time.Duration{100, 200, 300} {
			d, ok := g.RetryHint(time.Second)
			lo, hi := want*time.Millisecond*85/100, want*time.Millisecond*115/100
			if !ok || d < lo || d > hi {
				t.Fatalf("hint %d: %v (%v), want %v ms ± 10 %% (with the rate's 5 %% of error)", i, d, ok, want)
			}
		}
		if d, _ := g.RetryHint(250 * time.Millisecond); d > 250*time.Millisecond {
			t.Fatalf("hint %v past its ceiling of 250 ms", d)
		}
		if d, _ := g.RetryHint(time.Second); d < 340*time.Millisecond || d > 460*time.Millisecond {
			t.Fatalf("after a hint cut at its ceiling: %v, want the 4th slot, 400 ms ± 10 %%", d)
		}
		time.Sleep(time.Second)
		// A second with no release later, the told times have passed: one
		// slot at the rate, which fell (from 100 ms to about 160 ms), not
		// the 500 ms of a schedule kept.
		if d, _ := g.RetryHint(time.Second); d < 100*time.Millisecond || d > 250*time.Millisecond {
			t.Fatalf("a second later: %v, want one slot at the fallen rate (100 to 250 ms), not the 500 ms of a schedule kept", d)
		}
	})
}

// TestRetryHintCountsWaitersAndHasAFloor pins the hint's terms: with n
// units waiting in the zone it is (n + 1) slots at the zone's rate (± 10 %
// jitter), and never under 10 ms, however fast slots free.
func TestRetryHintCountsWaitersAndHasAFloor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := testGateOn(t, "retry-terms", &Config{Zone: "retry-terms", Total: 1, Wait: caddy.Duration(time.Hour)}, Edge{RetryHints: true})
		for range 100 { // 10 releases/s for 10 s
			time.Sleep(100 * time.Millisecond)
			g.zone.grants.add(time.Now())
		}
		held := g.newTicket()
		if g.Admit(context.Background(), held, "", "").Outcome != limiter.Admitted {
			t.Fatal("want admitted")
		}
		ctx, cancel := context.WithCancel(context.Background())
		for range 4 {
			go g.Admit(ctx, g.newTicket(), "", "")
		}
		synctest.Wait()
		r, _ := g.zone.grants.rate(time.Now())
		slot := time.Duration(float64(time.Second) / r)
		if d, ok := g.RetryHint(time.Minute); !ok || d < 5*slot*9/10 || d > 5*slot*11/10 {
			t.Errorf("with 4 waiting at %.2f/s: hint %v, want 5 slots (%v) ± 10 %%", r, d, 5*slot)
		}
		cancel()
		synctest.Wait()
		g.Release(held)

		for range 2000 { // 1,000/s for 2 s: a slot of 1 ms
			time.Sleep(time.Millisecond)
			g.zone.grants.add(time.Now())
		}
		time.Sleep(time.Second) // the told times have passed
		if d, ok := g.RetryHint(time.Minute); !ok || d != 10*time.Millisecond {
			t.Errorf("at a slot of about 1 ms: hint %v, want the 10 ms floor", d)
		}
	})
}
