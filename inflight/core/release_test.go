package core

import (
	"context"
	"testing"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// TestSecondReleaseOfATicketPanicsAndGivesNothingBack: releasing an
// admitted unit twice panics and gives no slot back twice: with a cap of 2,
// one unit released twice and one still held, the zone counts 1 unit held,
// and 2 (the cap) once one more is admitted.
func TestSecondReleaseOfATicketPanicsAndGivesNothingBack(t *testing.T) {
	g := testGate(t, "release-twice", &Config{
		Zone:   "release-twice",
		Limits: []Limit{{Name: "client", Key: "{client}", Max: Max{Fixed: 2}}},
	})
	admit := func(tk *Ticket) limiter.Outcome { return g.Admit(context.Background(), tk, "", "").Outcome }
	a, b := g.newTicket("k"), g.newTicket("k")
	if admit(a) != limiter.Admitted || admit(b) != limiter.Admitted {
		t.Fatal("two units under a cap of 2: want both admitted")
	}
	g.Release(a)
	if !panicked(func() { g.Release(a) }) {
		t.Error("a second Release of a ticket returned quietly, want a panic")
	}
	if held := g.zone.State(limiter.Look{Dims: true}).Dims[0].Units; held != 1 {
		t.Errorf("%d units held after a second Release, want 1 (b's)", held)
	}
	c := g.newTicket("k")
	if got := admit(c); got != limiter.Admitted {
		t.Fatalf("the unit beside b: outcome %d, want admitted", got)
	}
	if held := g.zone.State(limiter.Look{Dims: true}).Dims[0].Units; held != 2 {
		t.Errorf("%d units held with b and c in flight, want 2", held)
	}
	g.Release(b)
	g.Release(c)
}

func panicked(f func()) (p bool) {
	defer func() { p = recover() != nil }()
	f()
	return false
}
