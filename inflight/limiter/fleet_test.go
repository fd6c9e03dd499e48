package limiter

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/internal/fleetref"
)

// sharedStore is a zone that admits within allowances of a fleet's ledger
// in memory (the reference's), the only member; it is closed when t ends.
func sharedStore(t *testing.T) store {
	z := NewZone(1, true, nil)
	z.SetLedger(fleetref.NewFleet().Join())
	t.Cleanup(func() { closeZone(z) })
	return store{acquire: z.Acquire, release: z.Release}
}

// closeZone closes z and waits for its asker to end (its calls under way,
// the allowance it gives back), so that a synctest bubble can end.
func closeZone(z *Zone) {
	z.Close()
	for {
		z.mu.Lock()
		running := z.asks.running
		z.mu.Unlock()
		if !running {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWaiterFullInItsShareWhileTheLedgerFails: while the ledger cannot
// answer (on_error open), a waiter whose instance's share of the cap is
// full goes on waiting, asked for again at each poll, and times out at
// its wait; everything comes back once it is gone.
func TestWaiterFullInItsShareWhileTheLedgerFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fl := fleetref.NewFleet()
		z := NewZone(1, false, nil)
		z.SetLedger(fl.Join())
		t.Cleanup(func() { closeZone(z) })
		lim := &Limits{Max: []int64{4}, Divisor: 2} // this instance's share: 2
		first, second := req(lim, "k"), req(lim, "k")
		for _, r := range []*Request{first, second} {
			if res := z.Acquire(context.Background(), r, WaitOptions{}); res.Outcome != Admitted {
				t.Fatalf("while the ledger answers: outcome %d, want admitted", res.Outcome)
			}
		}
		fl.Set(func(f *fleetref.Fleet) { f.Fail = true })
		res := z.Acquire(context.Background(), req(lim, "k"), WaitOptions{Wait: 2 * time.Second})
		if res.Outcome != Timeout {
			t.Fatalf("a waiter over its share while the ledger fails: outcome %d, want timed out (%d)", res.Outcome, Timeout)
		}
		fl.Recover() // so that the asker can give back what it holds, and end
		z.Release(first)
		z.Release(second)
		if got := z.Held(0); got != 0 || z.Waiting() != 0 {
			t.Fatalf("afterwards %d units held, %d waiting; want none", got, z.Waiting())
		}
	})
}
