package limiter

import "time"

// A Ledger keeps a zone's counts for a fleet of instances, such as blocks
// of units in Redis. It grants this instance allowances: units of a set
// (the key of a limit, or the total) that the fleet counts as this
// instance's, whether they are in flight or idle, so that the zone admits
// within them with no round trip (see allowance.go). The zone asks it for
// more, and gives back what it no longer needs, in calls it makes one at a
// time (Ask); the ledger never calls into the zone: what happens in the
// fleet meanwhile (another instance's hand-off, room freed), it announces
// on Changed, and the zone asks again.
//
// The sum of the allowances of a set, over the fleet, is never above its
// cap: the fleet admits no more than the cap, whichever instance admits.
type Ledger interface {
	// Ask sends c in one round trip: its returns first, then its wants, in
	// order, each granted all or none (a want refused that will wait holds
	// the room of its Hold against the later wants of the call). It sets
	// each want's answer, and c.Grants: the allowance the fleet gave this
	// instance in the call, per set, beyond the wants' own (room ahead,
	// hand-offs announced since the last call). An error means no answer:
	// nothing was granted; the returns are the ledger's to give back in a
	// later call.
	Ask(c *Call) error
	// Changed receives when the fleet may have room for this instance's
	// wants, or granted it allowance that the next Ask brings.
	Changed() <-chan struct{}
	// Tight reports whether the fleet is near the cap of set s, or another
	// instance wants its room: this instance then keeps no idle allowance
	// there, and gives back at once what its requests free.
	Tight(s Set) bool
	// Correct moves the tag of key (of dimension dim's fair set) on the
	// ledger's fair clock by delta, the correction of a charge to what its
	// grant held (see settle), with a later call: a correction lost to a
	// failure costs only that grant's ordering.
	Correct(dim int, key string, delta float64)
}

// A Set is a set a ledger keeps: dimension Dim's key of hash Hash (the
// zone's hash of it), or the total (Dim TotalDim, Hash 0).
type Set struct {
	Dim  int
	Hash uint64
}

// A Call is what a zone asks of its ledger in one round trip.
type Call struct {
	// Returns are the allowance this instance gives back, by set.
	Returns []Units
	// Wants are the requests that need more allowance than this instance
	// holds, waiters first in the queue order, then newcomers.
	Wants []Want
	// Grants are set by Ask: allowance granted beyond the wants' (see Ask).
	Grants []Units
}

// Units are units of one set. In Returns, Spare is the idle allowance
// this instance keeps there from now on; in Grants, the idle allowance the
// fleet lets it keep (see allowance.go).
type Units struct {
	Set   Set
	Units int64
	Spare int64
}

// A Want asks for the allowance one request needs beyond what this
// instance holds idle: Units in each of Sets (its keys' sets and the
// total's), all or none, each within its cap (Caps: the fleet's, the
// total's last).
type Want struct {
	Req   *Request
	Keys  []string // the request's keys, by dimension ("" for none)
	Sets  []Set
	Caps  []int64
	Units int64
	// Spares are the idle allowance this instance would like to keep in
	// each of Sets beyond the want (0 for a set it has not used lately):
	// granted, where the fleet has room beyond its reserve, in Grants.
	Spares []int64
	// Waits says that the request waits if refused.
	Waits bool
	// Hold lists the dimensions (TotalDim: the total) whose room the want
	// holds, if refused, against the later wants of the call: those that
	// refused it since it started waiting.
	Hold []int
	// Fair, if set, puts the want on the zone's fair clock in the ledger.
	Fair *FairWant

	// Set by Ask: Admitted (the allowance now covers it), Full by the set
	// of dimension Dim (TotalDim: the total), or Unavailable (the ledger
	// cannot answer and fails closed).
	Outcome Outcome
	Dim     int
	// Levels, if not nil, is the fleet's level of the request's
	// dimensions as the ledger read it.
	Levels Levels
}

// A FairWant places a want on the ledger's fair clock of its zone, the one
// clock of the fleet (see fair.go for the engine's): its key's tag orders
// it against the keys waiting at every instance, each listed under the set
// that refused it. Admitted, it charges its key Work/Weight.
type FairWant struct {
	Dim    int     // the dimension whose keys share
	Weight float64 // within MinWeight to MaxWeight
	Work   float64 // units × estimated hold, in unit-seconds
	// Waiting is the weight of the keys waiting under fair in this
	// process, the same in every want of a call.
	Waiting float64
	// More says that other requests of the key wait here besides this one.
	More bool
}

// fleetPoll bounds how long a want can miss an announcement (a lost
// notice) before it is asked again.
const fleetPoll = 250 * time.Millisecond
