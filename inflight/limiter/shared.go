package limiter

// LimitsOf returns the limits that apply to req now: its own, or the
// zone's latest once a reload retired its own. A shared store checks its
// waiters against them, so they move to new limits on reload as the
// in-process queue's do.
func (z *Zone) LimitsOf(req *Request) *Limits { return z.limitsFor(req) }
