package fleetref

import (
	"slices"
	"testing"

	"github.com/caddy-inflight/caddy-inflight/inflight/fleet"
)

// TestReportHoldingLessAnnouncesRoom pins the notice of room a report
// stops holding: an instance that yields a set (its need there falls to
// 0 while it waits for another), withdraws its report, or is granted
// units for another waiter that leave its head beyond its target,
// announces "f" where another instance reports, so that instance asks
// again at once. Unannounced, two instances each refused in one of two
// sets by the other's hold, and each then yielding the other set, waited
// for the next poll with room in both; and a waiter refused by the room
// held for another instance's head waited for the poll once that
// instance's own grant had ended it.
func TestReportHoldingLessAnnouncesRoom(t *testing.T) {
	l := New()
	now := int64(1000)
	call := func(inst string, report fleet.Report, want int64) []string {
		now++
		c := &fleet.Call{Reports: []fleet.Report{report}}
		if want > 0 {
			c.Wants = []fleet.Want{{Sets: []string{"k"}, Caps: []int64{8}, Units: []int64{want}, Spares: []int64{0},
				Holds: []bool{false}, Allowance: []int64{0}, AllowanceSpare: []int64{0}}}
		}
		notices, stale := l.Apply(now, Caller{Instance: inst, Version: now, Lease: 5000, ReportLife: 1000}, c)
		if stale {
			t.Fatalf("%s's call at %d was stale", inst, now)
		}
		return notices
	}
	needs := func(need int64, target float64) fleet.Report {
		return fleet.Report{Set: "k", Head: 1, Need: need, Target: target, Entries: "- 1 1"}
	}
	owed4 := fleet.Report{Set: "k", Head: 4, Need: 4, Target: 4, Entries: "- 4 4"}
	for _, c := range []struct {
		what    string
		inst    string
		report  fleet.Report
		want    int64 // units a want of the call asks for in k (0: none)
		notices []string
	}{
		{"a alone reports, holding 1", "a", needs(1, 2), 0, []string{"w k"}},
		{"a needs nothing: no one else reports, so no notice", "a", needs(0, 2), 0, nil},
		{"a holds 1 again", "a", needs(1, 2), 0, nil},
		{"b reports too", "b", needs(1, 1), 0, []string{"w k"}},
		{"a yields the set: its need falls to 0", "a", needs(0, 2), 0, []string{"f k"}},
		{"a needs 1 again, then keeps it", "a", needs(1, 2), 0, nil},
		{"a's target falls below its head: it holds nothing", "a", needs(1, 0.5), 0, []string{"f k"}},
		{"a holds 1 again", "a", needs(1, 2), 0, nil},
		{"a withdraws", "a", fleet.Report{Set: "k"}, 0, []string{"f k"}},
		{"a reports anew", "a", needs(1, 2), 0, []string{"w k"}},
		{"b withdraws: it held 1 (its head fits its target)", "b", fleet.Report{Set: "k"}, 0, []string{"f k"}},
		{"a withdraws with no one else reporting", "a", fleet.Report{Set: "k"}, 0, nil},
		{"b reports anew", "b", needs(1, 1), 0, []string{"w k"}},
		{"a reports a head of 4 it is owed", "a", owed4, 0, []string{"w k"}},
		{"a is granted 2 for another waiter: its head no longer fits its target", "a", owed4, 2, []string{"f k"}},
	} {
		if got := call(c.inst, c.report, c.want); !slices.Equal(got, c.notices) {
			t.Fatalf("%s: notices %q, want %q", c.what, got, c.notices)
		}
	}
}
