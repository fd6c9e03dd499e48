package fleetref

import (
	"slices"
	"testing"

	"github.com/caddy-inflight/caddy-inflight/inflight/fleet"
)

// TestReportHoldingLessAnnouncesRoom pins the notice of room a report
// stops holding: an instance that yields a set (its need there falls to
// 0 while it waits for another), or withdraws its report, announces "f"
// where another instance reports, so that instance asks again at once.
// Unannounced, two instances each refused in one of two sets by the
// other's hold, and each then yielding the other set, waited for the next
// poll with room in both.
func TestReportHoldingLessAnnouncesRoom(t *testing.T) {
	l := New()
	now := int64(1000)
	call := func(inst string, reports ...fleet.Report) []string {
		now++
		notices, stale := l.Apply(now, Caller{Instance: inst, Version: now, Lease: 5000, ReportLife: 1000}, &fleet.Call{Reports: reports})
		if stale {
			t.Fatalf("%s's call at %d was stale", inst, now)
		}
		return notices
	}
	needs := func(need int64, target float64) fleet.Report {
		return fleet.Report{Set: "k", Head: 1, Need: need, Target: target, Entries: "- 1 1"}
	}
	for _, c := range []struct {
		what    string
		inst    string
		report  fleet.Report
		notices []string
	}{
		{"a alone reports, holding 1", "a", needs(1, 2), []string{"w k"}},
		{"a needs nothing: no one else reports, so no notice", "a", needs(0, 2), nil},
		{"a holds 1 again", "a", needs(1, 2), nil},
		{"b reports too", "b", needs(1, 1), []string{"w k"}},
		{"a yields the set: its need falls to 0", "a", needs(0, 2), []string{"f k"}},
		{"a needs 1 again, then keeps it", "a", needs(1, 2), nil},
		{"a's target falls below its head: it holds nothing", "a", needs(1, 0.5), []string{"f k"}},
		{"a holds 1 again", "a", needs(1, 2), nil},
		{"a withdraws", "a", fleet.Report{Set: "k"}, []string{"f k"}},
		{"a reports anew", "a", needs(1, 2), []string{"w k"}},
		{"b withdraws: it held 1 (its head fits its target)", "b", fleet.Report{Set: "k"}, []string{"f k"}},
		{"a withdraws with no one else reporting", "a", fleet.Report{Set: "k"}, nil},
	} {
		if got := call(c.inst, c.report); !slices.Equal(got, c.notices) {
			t.Fatalf("%s: notices %q, want %q", c.what, got, c.notices)
		}
	}
}
