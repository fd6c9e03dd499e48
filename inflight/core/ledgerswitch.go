package core

import (
	"sync/atomic"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/fleet"
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// ledgerSwitch is the one ledger a zone's engine asks, set once: a reload
// that changes the store's options puts the new store's ledger behind it
// while requests are in flight. Its epoch changes with each ledger put
// behind it, so the engine writes all it holds through the new one
// before it asks for more.
type ledgerSwitch struct {
	cur atomic.Pointer[switched]
}

type switched struct {
	l limiter.Ledger
	n uint64 // ledgers put behind the switch so far
}

// put makes l the ledger behind s.
func (s *ledgerSwitch) put(l limiter.Ledger) {
	var n uint64
	if old := s.cur.Load(); old != nil {
		n = old.n + 1
	}
	s.cur.Store(&switched{l: l, n: n})
}

func (s *ledgerSwitch) Ask(c *fleet.Call) error  { return s.cur.Load().l.Ask(c) }
func (s *ledgerSwitch) Changed() <-chan struct{} { return s.cur.Load().l.Changed() }
func (s *ledgerSwitch) Tight(name string) bool   { return s.cur.Load().l.Tight(name) }
func (s *ledgerSwitch) Lease() time.Duration     { return s.cur.Load().l.Lease() }
func (s *ledgerSwitch) FailOpen() bool           { return s.cur.Load().l.FailOpen() }

// Epoch is the current ledger's, in the low 40 bits, and the count of
// ledgers put behind the switch above them.
func (s *ledgerSwitch) Epoch() uint64 {
	c := s.cur.Load()
	return c.n<<40 + c.l.Epoch()
}

var _ limiter.Ledger = (*ledgerSwitch)(nil)
