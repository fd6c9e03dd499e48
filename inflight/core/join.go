package core

import (
	"fmt"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// Edge is what a protocol's handler tells its gate about itself.
type Edge struct {
	// Site names where the handler stands (`example.com`, `layer4
	// :5432`): an unnamed zone is named after it and the handler's position
	// among the unnamed handlers there (`example.com#1`).
	Site string
	// Noun names a unit in log lines: request, connection.
	Noun string
	// AddressKeys are the key templates whose values are client
	// addresses, logged in clear at debug level; any other key may carry a
	// secret and is logged as a hash.
	AddressKeys []string
	// UnitMax tells that a limit's max may be a placeholder, resolved per
	// unit into the ticket's Req.Max by the edge.
	UnitMax bool
	// Costs tells that units have costs (the edge sets each ticket's
	// Req.Cost): the cost histogram and the admin API's cost count them.
	// Without, every unit holds one unit, and admitting one writes nothing
	// the whole zone shares.
	Costs bool
	// Show writes a key template as the user wrote it, for messages; nil
	// shows it as it is.
	Show func(tmpl string) string
	// Adaptive, if set, makes the zone's total adaptive (the edge measures
	// its units' latency); it counts as the zone's total.
	Adaptive *limiter.AdaptiveConfig
	// EarlyRefusal refuses a unit admitted with a deadline (AdmitWithin)
	// at arrival when the zone's recent grant rate says its wait would run
	// out; the gate then counts the zone's releases.
	EarlyRefusal bool
	// RetryHints says that the edge asks RetryHint when it refuses a
	// unit; the gate then counts the zone's releases.
	RetryHints bool
	// Metrics are the edge's own collectors, registered with the gate's
	// in each config's metrics registry.
	Metrics []prometheus.Collector
}

// Join checks cfg, applying its defaults, and joins its zone, shared with
// other handlers and config generations, binding the shared store if any.
// On error the caller must still call Leave, as Caddy calls Cleanup.
func Join(ctx caddy.Context, cfg *Config, edge Edge) (*Gate, error) {
	g := &Gate{cfg: cfg, ctx: ctx, logger: ctx.Logger(), refusedLog: edge.Noun + " refused"}
	cfg.setDefaults()
	if err := cfg.check(edge.Adaptive != nil); err != nil {
		return g, fmt.Errorf("inflight: %w", err)
	}
	for _, l := range cfg.Limits {
		if l.Max.Placeholder != "" && !edge.UnitMax {
			return g, fmt.Errorf("inflight: limit %q: max %q is not allowed here: want a positive integer (placeholders are resolved per HTTP request only)", l.Name, l.Max.Placeholder)
		}
	}
	g.compile(edge)
	if err := g.compileFair(); err != nil {
		return g, fmt.Errorf("inflight: %w", err)
	}
	eventsApp, err := ctx.App("events")
	if err != nil {
		return g, fmt.Errorf("inflight: getting events app: %v", err)
	}
	g.events = eventsApp.(*caddyevents.App)
	if err := registerMetrics(ctx.GetMetricsRegistry(), edge.Metrics); err != nil {
		return g, fmt.Errorf("inflight: registering metrics: %v", err)
	}
	if err := g.joinZone(ctx, edge); err != nil {
		return g, err
	}
	if edge.Adaptive != nil {
		g.adaptive = g.zone.adaptive.adaptive(*edge.Adaptive)
		if !cfg.DryRun {
			g.limits.Adaptive = g.adaptive
		}
	}
	g.initMetrics()
	g.zone.keyDisplay.Store(g.keyDisplay())
	g.zone.view.Store(g.view())
	g.zone.Adopt(g.limits)
	for _, n := range cfg.Notices() {
		n.Log(g.logger)
	}
	return g, nil
}

// Leave leaves the zone; units still in flight release into it safely,
// and its waiters move to the limits of the config that replaced this one.
func (g *Gate) Leave() error {
	if g.zone == nil {
		return nil
	}
	g.zone.Retire(g.limits)
	if g.adaptive != nil {
		g.zone.adaptive.leave()
	}
	_, err := zones.Delete(g.zoneID)
	return err
}

// Zone returns the zone's name, as metrics and the admin API show it.
func (g *Gate) Zone() string { return g.label }

// compile turns the config into what Admit reads.
func (g *Gate) compile(edge Edge) {
	c := g.cfg
	g.limits = &limiter.Limits{
		Max:     make([]int64, len(c.Limits)),
		Total:   int64(c.Total),
		MaxKeys: int64(c.MaxKeys),
		Divisor: int64(c.Replicas),
	}
	g.addresses = make([]bool, len(c.Limits))
	for i, l := range c.Limits {
		g.limits.Max[i] = l.Max.Fixed
		g.addresses[i] = slices.Contains(edge.AddressKeys, l.Key)
	}
	g.costed = edge.Costs
	g.early = edge.EarlyRefusal && !c.DryRun
	g.countGrants = (edge.EarlyRefusal || edge.RetryHints) && !c.DryRun
	g.classed = c.Priority != ""
	if !c.DryRun {
		// Without priority every request is normal (weight 1), as beside
		// a handler of the same zone that has one.
		g.waitOpt = limiter.WaitOptions{Wait: time.Duration(c.Wait), MaxWaiting: c.MaxWaiting, Class: limiter.Normal}
	}
}

// joinZone takes a reference to the gate's zone: with a shared store, a
// zone of the fleet, which admits within the allowances of the store's
// ledger.
func (g *Gate) joinZone(ctx caddy.Context, edge Edge) error {
	c := g.cfg
	hasTotal := c.Total > 0 || edge.Adaptive != nil
	g.label = c.Zone
	if g.label == "" {
		g.label = numberedZone(ctx, edge.Site)
	}
	shape := zoneID(g.label, c.Zone != "", c.Limits, hasTotal)
	show := edge.Show
	if show == nil {
		show = func(s string) string { return s }
	}
	if err := claimZone(ctx.GetMetricsRegistry(), c.Zone, shape, describeShape(c.Limits, hasTotal, show)); err != nil {
		return fmt.Errorf("inflight: %w", err)
	}
	g.zoneID = shape
	var store SharedStore
	if c.StoreRaw != nil {
		mod, err := ctx.LoadModule(c, "StoreRaw")
		if err != nil {
			return fmt.Errorf("inflight: loading store: %v", err)
		}
		store = mod.(SharedStore)
		g.zoneID += "\x00store" // a fleet's zone counts apart from an in-process one
	}
	z, err := loadZone(g.zoneID, g.label, c.Limits, hasTotal)
	if err != nil {
		return fmt.Errorf("inflight: zone %q: %v", g.label, err)
	}
	g.zone = z
	if store != nil {
		z.useLedger(store.Ledger(fleetID(g.label, shape)))
	}
	return nil
}

func (g *Gate) initMetrics() {
	g.rejected = map[string][]prometheus.Counter{}
	for _, reason := range reasons {
		cs := make([]prometheus.Counter, 0, len(g.cfg.Limits)+1)
		for _, l := range g.cfg.Limits {
			cs = append(cs, rejectedTotal.WithLabelValues(g.label, l.Name, reason))
		}
		g.rejected[reason] = append(cs, rejectedTotal.WithLabelValues(g.label, totalName, reason))
	}
	g.zone.startStats()
	for _, o := range waitOutcomes {
		g.waited[o] = teeObserver{waitSeconds.WithLabelValues(g.label, outcomeLabel(o)), &g.zone.stats.waits}
	}
	if g.costed {
		g.costs = costObserver{requestCost.WithLabelValues(g.label), &g.zone.units}
	}
}
