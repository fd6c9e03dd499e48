package core

import (
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// Store admits and releases requests for the limits of one zone, all or
// nothing: a *limiter.Zone, which keeps its counts in this process, or for
// a fleet within the allowances its ledger grants.
type Store = limiter.Store

// SharedStore is a store module (namespace http.handlers.inflight.stores)
// that keeps a fleet's counts outside the process: a ledger per zone.
type SharedStore interface {
	// Identity names the store's setup (its options): a zone of the same
	// shape under another setup is another zone, with a ledger of its
	// own, so that a reload that changes the store's options leaves the
	// requests admitted before it to the ledger that admitted them.
	Identity() string
	// Ledger returns the ledger of one zone, for the zone's life: id names
	// the zone and its shape the same way on every instance.
	Ledger(id string) limiter.Ledger
}
