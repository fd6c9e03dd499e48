package inflight

import (
	"context"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// Store admits and releases requests for the limits of one zone, all or
// nothing. The in-process store is *limiter.Zone; a store shared by a fleet
// can stand in for it without changes to the handler.
type Store interface {
	// Acquire takes one slot in every dimension of req, waiting as opt
	// allows, or takes none.
	Acquire(ctx context.Context, req *limiter.Request, opt limiter.WaitOptions) limiter.Result
	// Release gives back the slots of an admitted req.
	Release(req *limiter.Request)
}

var _ Store = (*limiter.Zone)(nil)

// SharedStore is a store module (namespace http.handlers.inflight.stores)
// that keeps counts outside the process, so a fleet shares them.
type SharedStore interface {
	// Bind returns the store of one zone. id names the zone and its shape
	// the same way on every instance; local counts this instance's
	// requests, and enforces the caps alone when the store is unreachable
	// and fails open.
	Bind(id string, limits []string, hasTotal bool, local *limiter.Zone) Store
}

// ObserveStore records one shared store operation (acquire, release,
// renew) for one zone (its name, as in the other metrics) in the store
// metrics: its latency, and whether it failed.
func ObserveStore(store, zone, op string, took time.Duration, failed bool) {
	storeSeconds.WithLabelValues(store, zone, op).Observe(took.Seconds())
	if failed {
		storeErrors.WithLabelValues(store, zone, op).Inc()
	}
}
