package llm

import (
	"net/http"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
)

// Meter is a handler's side of its zone's token accounting: the estimate
// its requests count, with the output estimate the zone learnt, and the
// usage their responses report.
type Meter struct {
	cost *TokensCost
	gate *core.Gate
}

// Join has the handler of g, whose cost tokens are t, take part in its
// zone's token accounting.
func Join(g *core.Gate, t *TokensCost) *Meter {
	return &Meter{cost: t, gate: g}
}

// Estimate returns the estimate of r, whose body b was read (ReadBody,
// with MaxBody), counting the output estimate learnt for b's model with
// LearnOutput (see TokensCost). With IncludeUsage it may rewrite r's body
// (includeUsage).
func (m *Meter) Estimate(r *http.Request, b *Body) Estimate {
	t := m.cost
	output, learned := t.DefaultOutput, int64(0)
	if t.LearnOutput {
		output, learned = m.gate.OutputEstimate(b.Model(), output)
	}
	return t.estimate(r, b, output, learned)
}

// Report records the usage u the model reported for the request of t,
// which named model and was estimated at e, and sets its fair charge to
// it; its output count may teach the learned estimate (see Estimate).
func (m *Meter) Report(t *core.Ticket, model string, u core.TokenUsage, e Estimate) {
	m.gate.ReportUsage(t, model, u, e.Cost, e.teaches)
}
