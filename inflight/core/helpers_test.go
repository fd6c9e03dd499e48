package core

import (
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// newTicket returns a ticket for dims limits, as InitTicket makes them,
// with an empty slot: the per-key series read its units (none) as an
// admitted unit's, until Admit gives it its own.
func newTicket(dims int) *Ticket {
	t := new(Ticket)
	(&Gate{cfg: &Config{Limits: make([]Limit, dims)}}).InitTicket(t)
	t.Slot = new(limiter.Slot)
	return t
}

// testGate joins a gate to the zone named label without a Caddy context,
// as Join does: cfg's defaults, its compiled limits and the zone's metrics.
// It has no events app: its refusals emit no event.
func testGate(t *testing.T, label string, cfg *Config) *Gate {
	t.Helper()
	return testGateOn(t, label, cfg, Edge{})
}

// testGateOn is testGate for the edge edge.
func testGateOn(t *testing.T, label string, cfg *Config, edge Edge) *Gate {
	t.Helper()
	g := joinTestGate(t, label, cfg, edge)
	t.Cleanup(func() { g.Leave() })
	return g
}

// joinTestGate is testGateOn for a gate its caller leaves (Leave), as a
// reload leaves the old handler's.
func joinTestGate(t *testing.T, label string, cfg *Config, edge Edge) *Gate {
	t.Helper()
	cfg.setDefaults()
	if err := cfg.check(false); err != nil {
		t.Fatal(err)
	}
	g := &Gate{cfg: cfg, label: label, logger: zap.NewNop(), refusedLog: "unit refused"}
	g.compile(edge)
	if err := g.compileFair(); err != nil {
		t.Fatal(err)
	}
	hasTotal := cfg.Total > 0
	g.zoneID = zoneID(label, true, cfg.Limits, hasTotal)
	z, err := loadZone(g.zoneID, label, cfg.Limits, hasTotal)
	if err != nil {
		t.Fatal(err)
	}
	g.zone = z
	g.initMetrics()
	g.zone.view.Store(g.view())
	g.zone.Adopt(g.limits)
	return g
}

// newTicket returns a ticket of g with keys.
func (g *Gate) newTicket(keys ...string) *Ticket {
	t := new(Ticket)
	g.InitTicket(t)
	copy(t.Req.Keys, keys)
	return t
}

// eventually waits for cond, generously: verdicts never depend on timing.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 10s", what)
		}
	}
}
