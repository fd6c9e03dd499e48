package limiter

import (
	"context"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/fleet"
	"github.com/caddy-inflight/caddy-inflight/inflight/internal/fleetref"
)

// TestTargetsShareTheCapByWeightedMaxMin: the targets every instance
// computes from a set's table share the room (the cap less the units of
// the instances that do not report) among the keys waiting anywhere by
// weighted max-min, and the first instance to report gets its head's
// units even beyond its share.
func TestTargetsShareTheCapByWeightedMaxMin(t *testing.T) {
	member := func(seq, head int64, entries string) fleet.Member {
		return fleet.Member{Reports: true, Seq: seq, Head: head, Entries: entries}
	}
	for _, c := range []struct {
		name    string
		cap     int64
		members []fleet.Member
		want    []float64 // each reporting member's target, seen from itself
	}{
		{"weights 2:1", 9, []fleet.Member{member(1, 1, "x 2 100 0"), member(2, 1, "y 1 100 0")}, []float64{6, 3}},
		{"a key wants less than its share", 9, []fleet.Member{member(1, 1, "x 2 1 0"), member(2, 1, "y 1 100 0")}, []float64{1, 8}},
		{"one key at two instances", 8, []fleet.Member{member(1, 1, "x 1 30 0"), member(2, 1, "x 1 10 0;y 1 100 0")}, []float64{3, 5}},
		{"an instance that does not report", 9, []fleet.Member{member(1, 1, "x 1 100 0"), member(2, 1, "y 1 100 0"), {Units: 3}}, []float64{3, 3}},
		{"without fair: by units waiting", 3, []fleet.Member{member(1, 1, "- 4 4 0"), member(2, 1, "- 2 2 0")}, []float64{2, 1}},
		{"the first's head beyond its share", 6, []fleet.Member{member(1, 5, "x 1 100 0"), member(2, 1, "y 1 100 0")}, []float64{5, 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for i, want := range c.want {
				members := append([]fleet.Member(nil), c.members...)
				members[i].Self = true
				tt := targetIn(fleet.Table{Set: "s", Members: members}, c.cap, map[string]*keyOwed{}, time.Now())
				got, shared := tt.mine, tt.shared
				if !shared || math.Abs(got-want) > 1e-9 {
					t.Errorf("instance %d's target of %d: %.3f (shared %v), want %.3f", i, c.cap, got, shared, want)
				}
			}
		})
	}
}

// TestOthersYieldToTheFirstsHead: where the instance that reported first
// is owed its head's units beyond its share, the others' targets say they
// yield to it (they then keep no idle units short of their own heads: see
// keep), and its own does not; within its share, none yields.
func TestOthersYieldToTheFirstsHead(t *testing.T) {
	for _, firstHead := range []int64{5, 3} {
		for i := range 2 {
			members := []fleet.Member{{Reports: true, Seq: 1, Head: firstHead, Entries: "x 1 100 0"}, {Reports: true, Seq: 2, Head: 1, Entries: "y 1 100 0"}}
			members[i].Self = true
			want := firstHead > 3 && i == 1
			if got := targetIn(fleet.Table{Set: "s", Members: members}, 6, map[string]*keyOwed{}, time.Now()).yields; got != want {
				t.Errorf("the first's head of %d units, shares of 3: instance %d yields %v, want %v", firstHead, i, got, want)
			}
		}
	}
}

// TestTargetsMoveByWhatAKeyWasOwed: two keys of equal weight share a cap
// of 6, but over 4 s x held nothing over the fleet and y all 6 (its
// report's unit-seconds grew by 24): read again then, x is owed more than
// a unit-second a second, and its instance's target moves up by a unit
// (the most), y's down by as much.
func TestTargetsMoveByWhatAKeyWasOwed(t *testing.T) {
	member := func(seq int64, entries string) fleet.Member {
		return fleet.Member{Reports: true, Seq: seq, Head: 1, Entries: entries}
	}
	for i, want := range []float64{4, 2} {
		table := func(y string) fleet.Table {
			members := []fleet.Member{member(1, "@a;x 1 100 7"), member(2, "@b;y 1 100 "+y)}
			members[i].Self = true
			return fleet.Table{Set: "s", Members: members}
		}
		owed := map[string]*keyOwed{}
		now := time.Now()
		if got := targetIn(table("10"), 6, owed, now).mine; math.Abs(got-3) > 1e-9 {
			t.Fatalf("instance %d's first target %.3f, want 3 (nothing owed yet)", i, got)
		}
		got := targetIn(table("34"), 6, owed, now.Add(4*time.Second)).mine
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("instance %d's target 4 s later: %.3f, want %.0f", i, got, want)
		}
	}
}

// recorder is a ledger that keeps the reports of the calls it passes on.
type recorder struct {
	Ledger
	mu      sync.Mutex
	reports []fleet.Report
}

func (r *recorder) Ask(c *fleet.Call) error {
	r.mu.Lock()
	r.reports = append(r.reports, c.Reports...)
	r.mu.Unlock()
	return r.Ledger.Ask(c)
}

// TestReportCarriesFairWeights: a zone whose fair waiter the fleet
// refused (another instance holds the rest of the key's cap) reports its
// key's weight and demand, under the key's name in the fleet: the weight
// (3) and its units waiting or in flight here (2), so that every
// instance shares the cap by the same weights.
func TestReportCarriesFairWeights(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := fleetref.NewFleet()
		other := fleetZones(t, f, 1, 1, false)[0]
		z := NewZone(1, false, nil)
		rec := &recorder{Ledger: f.Join()}
		z.SetLedger(rec)
		t.Cleanup(func() { closeZone(t, z) })
		lim := &Limits{Max: []int64{2}}
		there, holder := req(lim, "x"), req(lim, "x")
		mustAdmit(t, other, there)
		defer there.slot.Release()
		mustAdmit(t, z, holder)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan Result, 1)
		go func() {
			done <- z.Acquire(ctx, req(lim, "x"), WaitOptions{Wait: time.Hour, Fair: true, KeyDim: 0, Weight: 3})
		}()
		synctest.Wait()
		cancel()
		<-done
		holder.slot.Release()
		rec.mu.Lock()
		defer rec.mu.Unlock()
		var entries []string
		for _, r := range rec.reports {
			if r.Head > 0 {
				entries = append(entries, r.Entries)
			}
		}
		if len(entries) == 0 {
			t.Fatal("the zone reported nothing while its fair waiter waited")
		}
		self, entry, _ := strings.Cut(entries[0], ";")
		e := strings.Fields(entry)
		if !strings.HasPrefix(self, "@") || len(e) != 4 || e[0] != setName(0, "x") {
			t.Fatalf("report entries %q, want the instance's name, then one entry, the key's name in the fleet %s", entries[0], setName(0, "x"))
		}
		if w, _ := strconv.ParseFloat(e[1], 64); w != 3 {
			t.Errorf("report entries %q: weight %s, want 3 (the key's)", entries[0], e[1])
		}
		if u, _ := strconv.ParseFloat(e[2], 64); u != 2 {
			t.Errorf("report entries %q: units %s, want 2 (1 in flight, 1 waiting)", entries[0], e[2])
		}
	})
}
