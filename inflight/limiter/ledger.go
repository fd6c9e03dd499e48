package limiter

import (
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/fleet"
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
//     (floor(target) - its allowance is at least what the head lacks
//     beyond the instance's idle units, need) holds need units against
//     the wants of the instances that reported after it, do not report,
//     or would pass their own target.
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
	Ask(c *fleet.Call) error
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
	// Epoch changes whenever the ledger may have lost what this instance
	// wrote (it answers again after a failure, as after a restart): the
	// zone then writes every allowance it holds again, before it asks for
	// more.
	Epoch() uint64
	// FailOpen says what a request short of allowance gets while the
	// ledger cannot answer: admitted within this instance's share of the
	// caps (true), or refused (Unavailable).
	FailOpen() bool
}

// fleetPoll bounds how long a waiter can miss an announcement (a lost
// notice) before it is asked for again, and how often a report is
// renewed: a quarter of its life.
const fleetPoll = fleet.ReportLife / 4
