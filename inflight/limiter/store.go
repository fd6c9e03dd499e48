package limiter

import "context"

// Store admits and releases requests for the limits of one zone, all or
// nothing: a Zone counts them in this process, and with a Ledger admits
// within the allowances the fleet grants it (see allowance.go).
type Store interface {
	// Acquire takes req's units in every dimension, waiting as opt
	// allows, or takes none.
	Acquire(ctx context.Context, req *Request, opt WaitOptions) Result
	// Release gives back the units of an admitted req.
	Release(req *Request)
}

var _ Store = (*Zone)(nil)
