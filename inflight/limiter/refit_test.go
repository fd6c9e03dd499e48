package limiter_test

import (
	"math/rand/v2"
	"testing"

	"github.com/caddy-inflight/caddy-inflight/inflight/fleet"
	"github.com/caddy-inflight/caddy-inflight/inflight/internal/fleetref"
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// TestGrantsInMatchesTheLedger pins the engine's reading of a table
// (grantsIn: would the ledger grant this want now?) to the reference
// ledger's Holds rule. Random histories of reports, grants and writes by
// three instances build a set; then the engine's answer from the table
// an instance reads there is compared with what the ledger does with the
// call it would make: its report (at its place or a new one) and a want.
func TestGrantsInMatchesTheLedger(t *testing.T) {
	const set = "0:k"
	insts := []string{"a", "b", "c"}
	rng := rand.New(rand.NewPCG(39, 1))
	granted, refused := 0, 0
	for round := range 20000 {
		type step struct {
			who string
			c   fleet.Call
		}
		var hist []step
		for range 1 + rng.IntN(8) {
			var c fleet.Call
			switch rng.IntN(3) {
			case 0:
				head := 1 + rng.Int64N(3)
				c.Reports = []fleet.Report{{Set: set, New: rng.IntN(2) == 0, Head: head, Need: rng.Int64N(head + 1),
					Target: float64(rng.IntN(13)) / 2 * (1 + rng.Float64()/1e3), Entries: "-"}}
			case 1:
				c.Wants = []fleet.Want{{Sets: []string{set}, Caps: []int64{1000}, Units: []int64{1 + rng.Int64N(2)},
					Spares: []int64{0}, Holds: []bool{false}, Allowance: []int64{0}, AllowanceSpare: []int64{0}}}
			default:
				c.Writes = []fleet.Write{{Set: set, Units: rng.Int64N(3)}}
			}
			hist = append(hist, step{insts[rng.IntN(len(insts))], c})
		}
		me := insts[rng.IntN(len(insts))]
		units, c := 1+rng.Int64N(3), 1+rng.Int64N(7)
		target := float64(rng.IntN(13)) / 2 * (1 + rng.Float64()/1e3)
		placedLast := rng.IntN(2) == 0

		// replay plays the history on a fresh ledger, then the call
		// last by me, and returns that call.
		replay := func(last fleet.Call) fleet.Call {
			l := fleetref.New()
			v := map[string]int64{}
			apply := func(who string, c *fleet.Call) {
				v[who]++
				l.Apply(1000, fleetref.Caller{Instance: who, Version: v[who], Lease: 60_000, ReportLife: 60_000}, c)
			}
			for _, s := range hist {
				c := s.c
				apply(s.who, &c)
			}
			apply(me, &last)
			return last
		}
		probe := replay(fleet.Call{Wants: []fleet.Want{{Sets: []string{set}, Caps: []int64{0}, Units: []int64{1}, Waits: true,
			Spares: []int64{0}, Holds: []bool{false}, Allowance: []int64{0}, AllowanceSpare: []int64{0}}}})
		if len(probe.Tables) != 1 {
			t.Fatalf("round %d: the probe got %d tables", round, len(probe.Tables))
		}
		call := replay(fleet.Call{
			Reports: []fleet.Report{{Set: set, New: placedLast, Head: units, Need: units, Target: target, Entries: "-"}},
			Wants: []fleet.Want{{Sets: []string{set}, Caps: []int64{c}, Units: []int64{units},
				Spares: []int64{0}, Holds: []bool{false}, Allowance: []int64{0}, AllowanceSpare: []int64{0}}},
		})
		want := call.Wants[0].Refused == 0
		if got := limiter.GrantsIn(probe.Tables[0], c, units, target, placedLast); got != want {
			t.Fatalf("round %d: %s wants %d of cap %d at target %v (placed last: %v) in %+v: grantsIn says %v, the ledger %v",
				round, me, units, c, target, placedLast, probe.Tables[0], got, want)
		}
		if want {
			granted++
		} else {
			refused++
		}
	}
	if granted < 2000 || refused < 2000 {
		t.Fatalf("granted %d, refused %d of 20,000: the cases miss one side", granted, refused)
	}
}
