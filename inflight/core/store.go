package core

import (
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// Store admits and releases requests for the limits of one zone, all or
// nothing: the in-process *limiter.Zone, or a store shared by a fleet in
// its place, without changes to the handler.
type Store = limiter.Store

// SharedStore is a store module (namespace http.handlers.inflight.stores)
// that keeps counts outside the process, so a fleet shares them.
type SharedStore interface {
	// Bind returns the store of one zone. id names the zone and its shape
	// the same way on every instance; local counts this instance's
	// requests, and enforces the caps alone when the store is unreachable
	// and fails open.
	Bind(id string, limits []string, hasTotal bool, local *limiter.Zone) Store
}
