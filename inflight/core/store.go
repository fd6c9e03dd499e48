package core

import (
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// SharedStore is a store module (namespace http.handlers.inflight.stores)
// that keeps a fleet's counts outside the process: a ledger per zone.
type SharedStore interface {
	// Ledger returns the ledger of one zone: id names the zone and its
	// shape the same way on every instance. A reload that changes the
	// store's options gives the zone a new ledger of the same instance,
	// which takes over what it holds (see limiter.Zone.SetLedger).
	Ledger(id string) limiter.Ledger
}
