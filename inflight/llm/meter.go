package llm

import (
	"net/http"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
)

// Meter is a handler's side of its zone's token accounting: the estimate
// its requests count, with the output estimate the zone learnt, and the
// usage their responses report, which the zone counts (metrics, the admin
// API) and learns from.
type Meter struct {
	cost    *TokensCost    // nil: the handler's costs are not in tokens
	zone    *outputLearner // the zone's, shared by its handlers
	learns  bool           // the handler's reports teach the zone's estimate
	metrics usageMetrics
}

// Join has the handler of g, whose units have costs, take part in its
// zone's token accounting: t is its cost tokens, nil for costs of another
// kind. The zone then learns its output estimate, never above t's
// DefaultOutput, if t learns it (LearnOutput), and stops learning it
// otherwise: the latest handler to join decides.
func Join(g *core.Gate, t *TokensCost) *Meter {
	l := g.Extension(func() core.Extension { return new(outputLearner) }).(*outputLearner)
	m := &Meter{cost: t, zone: l, metrics: usageMetricsFor(g.Zone())}
	ceiling := int64(0)
	if t != nil && t.LearnOutput {
		ceiling = t.DefaultOutput
	}
	l.ceiling.Store(ceiling)
	m.learns = ceiling > 0
	return m
}

// Estimate returns the estimate of r, whose body b was read (ReadBody,
// with MaxBody), counting the output estimate learnt for b's model with
// LearnOutput (see TokensCost). With IncludeUsage it may rewrite r's body
// (includeUsage). Only with cost tokens.
func (m *Meter) Estimate(r *http.Request, b *Body) Estimate {
	t := m.cost
	output, learned := t.DefaultOutput, int64(0)
	if t.LearnOutput {
		output, learned = m.outputEstimate(b.Model(), output)
	}
	return t.estimate(r, b, output, learned)
}

// outputEstimate returns the output tokens to count for a request that
// names model and no output: the model's learned estimate, or the zone's
// for a model without one, within ceiling, or ceiling until one is
// learnt; and the learned one (0 until learnt), the most a request naming
// more counts.
func (m *Meter) outputEstimate(model string, ceiling int64) (estimate, learned int64) {
	if l := m.zone.learned(model); l > 0 {
		learned = min(l, ceiling)
		return learned, learned
	}
	return ceiling, 0
}

// Report records the usage u the model reported for the request of t,
// which named model and was estimated at e, and sets its fair charge to
// it. Its output count teaches the zone's output estimate and the model's,
// if the handler learns them and e says the request's output was not
// bounded below the estimate's ceiling.
func (m *Meter) Report(t *core.Ticket, model string, u TokenUsage, e Estimate) {
	total := u.Total()
	if t.Slot != nil { // nil: let through by dry_run, holding nothing
		t.Slot.Used = total
	}
	m.metrics.input.Add(float64(u.Input))
	m.metrics.cached.Add(float64(u.Cached))
	m.metrics.output.Add(float64(u.Output))
	m.metrics.ratio.Observe(float64(total) / float64(max(e.Cost, 1)))
	m.zone.count(total, e.Cost)
	if e.teaches && m.learns {
		m.zone.learn(model, u.Output)
	}
}
