package limiter

import (
	"testing"
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
