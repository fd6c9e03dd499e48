package core

import "github.com/caddy-inflight/caddy-inflight/inflight/limiter"

// Levels returns the level of each of t's dimensions (the total last).
// Without fleet, in this process: the cap the gate enforces on t's key, in
// units (the fixed max or t's own, split by replicas, or the adaptive
// total's limit), and the units the key holds here. With fleet, the
// fleet's as this instance's latest calls to its ledger read them: what a
// request admitted within this instance's allowance knows of the fleet;
// nil without a ledger. They are written into buf when it has room.
func (g *Gate) Levels(t *Ticket, fleet bool, buf limiter.Levels) limiter.Levels {
	return g.zone.Levels(&t.Req, fleet, buf)
}
