package core

import "github.com/caddy-inflight/caddy-inflight/inflight/limiter"

// Level returns t's level in dimension d (limiter.TotalDim: the total) in
// this process: the cap the gate enforces on t's key, in units (the fixed
// max or t's own, split by replicas, or the adaptive total's limit), and
// the units the key holds here.
func (g *Gate) Level(t *Ticket, d int) (capacity, held int64) {
	capacity = g.limits.Cap(&t.Req, d)
	if d == limiter.TotalDim {
		held, _ = g.zone.Load(d)
		return capacity, held
	}
	return capacity, g.zone.KeyUnits(d, t.Req.Keys[d])
}

// FleetLevels returns the fleet's level of each of t's dimensions (the
// total last) as this instance's latest calls to its ledger read them:
// what a request admitted within this instance's allowance knows of the
// fleet. Nil without a ledger.
func (g *Gate) FleetLevels(t *Ticket) limiter.Levels { return g.zone.Levels(&t.Req) }
