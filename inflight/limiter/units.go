package limiter

// Units are counted within 1 to MaxCost, and every cap within the same
// range, so that the total's word (units in its low unitBits bits) never
// carries units into its request count: the caps and the
// costs of a configuration above MaxCost count as MaxCost, here and in a
// store shared by the fleet alike. A fixed max or total above it is
// refused when the configuration loads; a per-request max resolved above
// it (an "unlimited" map value) counts as MaxCost.

// ClampCost returns a request's cost in units: within 1 to MaxCost, 0 or
// less meaning 1.
func ClampCost(cost int64) int64 { return min(max(cost, 1), MaxCost) }

// units returns the units req takes under l: its cost, clamped to the
// unit range and to the smallest cap it is checked against (each
// dimension it has a key in, and the total if the zone counts one), so
// that a request is never refused for its size alone: it is admitted alone
// once the cap is free. whole says which caps: the fleet's (a store shared
// by it) or this instance's share of them (see Limits.Divisor).
func (l *Limits) units(req *Request, hasTotal, whole bool) int64 {
	u := ClampCost(req.Cost)
	for d, key := range req.Keys {
		if key != "" {
			u = min(u, l.capOf(req, d, whole))
		}
	}
	if c := l.capOf(req, TotalDim, whole); hasTotal && c > 0 {
		u = min(u, c)
	}
	return max(u, 1)
}

// capOf returns the cap of dimension d (TotalDim: the total, 0 for none)
// for req under l, within the unit range: the fleet's if whole, else this
// instance's (split by Divisor, or the adaptive total's current limit).
func (l *Limits) capOf(req *Request, d int, whole bool) int64 {
	var n int64
	switch {
	case d == TotalDim && l.Adaptive != nil && !whole:
		return min(l.Adaptive.Limit(), MaxCost)
	case d == TotalDim:
		n = l.Total
	case d < len(l.Max) && l.Max[d] > 0:
		n = l.Max[d]
	default:
		n = req.Max[d]
	}
	if !whole {
		n = split(n, l.Divisor)
	}
	return min(n, MaxCost)
}

// Cap returns the cap this instance enforces in dimension d (TotalDim: the
// total, 0 for none) for req, in units.
func (l *Limits) Cap(req *Request, d int) int64 { return l.capOf(req, d, false) }

// split is ceil(n/div), for caps shared by div instances; it never
// overflows.
func split(n, div int64) int64 {
	if div <= 1 {
		return n
	}
	q := n / div
	if n%div != 0 {
		q++
	}
	return q
}
