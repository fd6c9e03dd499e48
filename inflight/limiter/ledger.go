package limiter

// A Ledger keeps a zone's counts outside the process: a store shared by a
// fleet, such as leases in Redis. It answers claims and never calls back
// into the engine: the queue over it (SharedQueue) decides who is tried,
// in what order, what each holds and who waits, with the same code as the
// zone's own queue, and counts what the ledger admits in the zone (its
// local mirror).
type Ledger interface {
	// Take tries claims in order, each all or nothing, and returns the
	// verdict of each: Admitted with the lease that identifies what it
	// took (for Give), or Full with the refusing dimension. A claim that
	// waits and is refused holds, against every later claim of the call,
	// the room of the dimension that refused it and of each in its Hold:
	// what the first waits for is not taken by those behind it. An error
	// means no answer: nothing was taken.
	Take(claims []Claim) ([]Verdict, error)
	// Give gives back what the claim admitted with lease took. handOff
	// says that the queue has waiters and makes a call for them at once
	// (or, if none is left, says Idle): the ledger may leave the release
	// to that call, so that a waiter it frees is admitted in the same
	// round trip.
	Give(lease string, handOff bool)
	// Correct moves the tag of key (of dimension dim) on the ledger's fair
	// clock by delta, the correction of a charge to what its grant held
	// (see settle), with a later call: a correction lost to a failure
	// costs only that grant's ordering.
	Correct(dim int, key string, delta float64)
	// Record enters a claim that the zone admitted alone while the ledger
	// could not answer (a store that fails open), once it answers again,
	// and returns its lease.
	Record(c Claim) string
	// Idle says that the queue has no call under way and none to follow:
	// the ledger may do work it defers while calls follow one another (a
	// shared store removes the leases released meanwhile, which the next
	// call would have removed).
	Idle()
}

// A Claim is what one request asks of a Ledger: Units in the count of each
// dimension it has a key in, and in the total, each within its cap (the
// fleet's, in units: see Limits.units).
type Claim struct {
	// Keys holds one key per dimension; "" means none.
	Keys []string
	// Caps holds the cap of each dimension's key.
	Caps []int64
	// Total is the total's cap, if the zone counts one.
	Total int64
	Units int64
	// Waits says that the request waits if refused.
	Waits bool
	// Hold lists the dimensions (TotalDim: the total) whose room the claim
	// holds if refused: the dimensions whose counts refused it since it
	// started waiting.
	Hold []int
	// Fair, if set, puts the claim on the zone's fair clock in the ledger:
	// the one clock of the fleet.
	Fair *FairClaim
}

// A FairClaim places a claim on the ledger's fair clock of its zone, kept
// as the engine's (see fair.go) but for every instance at once: its keys'
// tags, virtual time, and the keys waiting anywhere, each listed under the
// dimension that refused it. The ledger admits a fair claim only if no
// other key listed under one of its dimensions has a smaller tag than the
// claim's key starts at; a claim refused so holds nothing (the room is
// kept for the key that goes first) and, if it waits, is listed under that
// dimension. Admitted, it charges its key Work/Weight, and moves virtual
// time on by Work shared among the weights waiting in the fleet.
type FairClaim struct {
	Dim    int     // the dimension whose keys share
	Weight float64 // the key's weight, within MinWeight to MaxWeight
	Work   float64 // units × estimated hold, in unit-seconds
	// Waiting is the weight of the keys waiting under fair in this
	// process, the same in every claim of a call: the fleet's is the sum
	// of every instance's.
	Waiting float64
	// More says that other requests of the key wait in this process
	// besides this one: admitted, the key stays listed as waiting, at its
	// new start, rather than unlisted until its next refusal.
	More bool
}

// Verdict is a Ledger's answer for one claim: Admitted with its Lease, or
// Full by dimension Dim (TotalDim: the total). The queue also answers
// KeysFull, for max_keys, which it checks itself.
type Verdict struct {
	Outcome Outcome
	Dim     int
	Lease   string
	// Held, if not nil, is the units the fleet holds in each of the
	// claim's dimensions once the ledger decided it (this claim's
	// included if admitted): index d for dimension d, len(Keys) for the
	// total; -1 where the ledger did not read it (a dimension it did not
	// reach before refusing, or one the claim has no key in). Data only:
	// the queue passes it on in Result.Levels.
	Held []int64
}

// adopt makes req hold what the queue took for from, its copy.
func (req *Request) adopt(from *Request) {
	req.lease, req.taken, req.held, req.hashes, req.fair = from.lease, from.taken, from.held, from.hashes, from.fair
}
