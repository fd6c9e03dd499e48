package limiter

import (
	"sync"
	"time"
)

// A Ledger keeps a zone's counts for a fleet of instances, such as Redis
// does (redisstore). It counts, per set (the key of a limit, or the
// total, by name: see setName), each instance's allowance: units the
// fleet counts as that instance's, in flight there or idle, so that the
// instance admits within them with no round trip (see allowance.go). The
// zone asks for more, writes what it gives back and reports its waiters,
// in calls it makes one at a time (Ask), and never learns of the fleet
// otherwise: what happens there meanwhile, the ledger announces on
// Changed and Tight, and the zone asks again. The ledger never calls into
// the zone.
//
// The rules a ledger keeps, exactly (internal/fleetref is their
// reference, and redisstore's script is pinned to it):
//   - The allowances of a set never sum above its cap when a want is
//     granted: the fleet admits no more than the cap, whichever instance
//     admits.
//   - An allowance lives for Lease unless written again, so a dead
//     instance's units come back within one lease.
//   - A report whose instance is owed room for its head there
//     (floor(target) - its allowance is at least head) holds head units
//     against the wants of the instances that reported after it, do not
//     report, or would pass their own target.
//   - Spare (idle units granted ahead) comes only from the room beyond the
//     reserve, a tenth of the cap, while no other instance reports on the
//     set, and the spares of a set sum to at most the reserve.
//   - A call that a later call of the instance overtook (a script that ran
//     late) changes nothing.
type Ledger interface {
	// Ask sends c in one round trip, and sets its answers: each want's,
	// and the tables of the sets reported on or refusing a waiting want.
	// An error means no answer: the zone cannot know what was applied,
	// and writes every allowance it holds again in its next call.
	Ask(c *Call) error
	// Changed receives when the fleet may have room for this instance's
	// waiters (units written back where it reports), when another
	// instance starts waiting where this one holds units (Tight), and
	// when the ledger is reachable again after a failure.
	Changed() <-chan struct{}
	// Tight reports whether another instance waits for set name: this
	// instance then keeps no idle units there.
	Tight(name string) bool
	// Lease is how long an allowance lives unless written again: the zone
	// writes every allowance it holds at least every Lease/3.
	Lease() time.Duration
	// FailOpen says what a request short of allowance gets while the
	// ledger cannot answer: admitted within this instance's share of the
	// caps (true), or refused (Unavailable).
	FailOpen() bool
}

// A Call is what a zone sends its ledger in one round trip: writes first,
// then reports, then wants, in order.
type Call struct {
	Writes  []Write
	Reports []Report
	Wants   []Want
	// Tables are set by Ask: each set reported on (with a head), then
	// each that refused a waiting want, once.
	Tables []Table
}

// A Write sets this instance's allowance in a set, absolute: the units it
// holds there and the spare it keeps; zero for both drops it.
type Write struct {
	Set          string
	Units, Spare int64
}

// A Report tells the fleet that this instance waits for a set: the units
// of its first waiter needing it (Head; 0 withdraws the report), its
// target there (see target.go), and what it waits for by key (Entries,
// opaque to the ledger). New places it after every report there: its
// first waiter changed.
type Report struct {
	Set     string
	New     bool
	Head    int64
	Target  float64
	Entries string
}

// A Want asks for Units[k] in each set Sets[k] (what its request needs
// beyond the idle units this instance holds there), all or none, each
// within its cap (Caps). Spares are idle units asked ahead in each (0 for
// a set not used lately): granted, they add to the instance's spare
// there. A want that Waits, refused, holds against the call's later wants
// the set that refused it and each set of Holds (those that refused its
// request since it started waiting).
type Want struct {
	Sets   []string
	Caps   []int64
	Units  []int64
	Spares []int64
	Waits  bool
	Holds  []bool

	// Set by Ask: Refused is 0 if granted, else the 1-based index of the
	// set that refused it; Levels, each set's allowances once it was
	// decided (-1: not read); Granted, the spare granted in each.
	Refused int
	Levels  []int64
	Granted []int64
}

// A Table is a set as the ledger holds it: every instance's allowance and
// report.
type Table struct {
	Set     string
	Members []Member
}

// A Member is one instance in a table.
type Member struct {
	Self  bool // this instance
	Units int64
	// Reports says it reports on the set: at place Seq, with its Head,
	// Target and Entries.
	Reports bool
	Seq     int64
	Head    int64
	Target  float64
	Entries string
}

// fleetPoll bounds how long a waiter can miss an announcement (a lost
// notice) before it is asked for again, and how often a report is
// renewed.
const fleetPoll = 250 * time.Millisecond

// Listing is how long a report lives in the ledger unless sent again: a
// waiter that left, or an instance that died, holds room for others at
// most this long.
const Listing = 4 * fleetPoll

// Tightness is what a ledger knows of the sets where other instances
// wait, for Tight: from its notices and from its calls' tables, each for
// Listing from when it learnt it.
type Tightness struct {
	mu    sync.RWMutex
	until map[string]time.Time
}

// Note records that another instance waits for set name, as of now.
func (t *Tightness) Note(name string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.until == nil {
		t.until = map[string]time.Time{}
	}
	if len(t.until) >= 1024 { // keep it small: drop what expired
		for n, u := range t.until {
			if !now.Before(u) {
				delete(t.until, n)
			}
		}
	}
	t.until[name] = now.Add(Listing)
}

// NoteTables records the sets of c's tables where another instance
// reports.
func (t *Tightness) NoteTables(c *Call, now time.Time) {
	for _, tb := range c.Tables {
		for _, m := range tb.Members {
			if m.Reports && !m.Self {
				t.Note(tb.Set, now)
				break
			}
		}
	}
}

// Tight reports whether another instance waited for set name within
// Listing of now.
func (t *Tightness) Tight(name string, now time.Time) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	u, ok := t.until[name]
	return ok && now.Before(u)
}
