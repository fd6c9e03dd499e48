package limiter

// A Ledger keeps a zone's counts outside the process: a store shared by a
// fleet, such as leases in Redis. It only takes and gives back; the queue
// over it (SharedQueue) decides who is tried, in what order, and who
// waits, with the same code as the zone's own queue.
type Ledger interface {
	// Take tries reqs in order, each all or nothing against the limits
	// that apply to it now, and returns the verdict of each: Admitted (its
	// units taken and recorded in it for Give), or Full or KeysFull with
	// the refusing dimension. A constraint that refused one request
	// refuses every later one of the call that needs it: what the first
	// waits for is not taken by those behind it. waits says which requests
	// wait if refused. An error means no answer: nothing was taken.
	Take(reqs []*Request, waits []bool) ([]Verdict, error)
	// Give gives back what an admitted request took.
	Give(req *Request)
	// Idle says that the queue has no call under way and none to follow:
	// the ledger may do work it defers while calls follow one another (a
	// shared store removes the leases released meanwhile, which the next
	// call would have removed).
	Idle()
}

// Verdict is a Ledger's answer for one request: Admitted, or Full or
// KeysFull by dimension Dim (TotalDim: the total).
type Verdict struct {
	Outcome Outcome
	Dim     int
}

// adopt makes req hold what the ledger took for from, its copy.
func (req *Request) adopt(from *Request) {
	req.Lease, req.taken, req.held, req.hashes = from.Lease, from.taken, from.held, from.hashes
}
