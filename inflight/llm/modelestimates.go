package llm

import (
	"cmp"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
)

// A zone learns an output estimate per model its requests name, beside its
// own, in a table of bounded size: model names come from clients. A
// model's reports teach its own series and the zone's; a request naming a
// model without an estimate of its own counts the zone's.
const (
	// maxModels bounds the models a zone keeps.
	maxModels = 64
	// maxModelName bounds a kept model's name, in bytes: a longer one
	// teaches and counts the zone's estimate only.
	maxModelName = 256
	// modelSeriesFrom is the reports a model needs before its estimate
	// is shown (metrics, admin API), whether learnt yet or not.
	modelSeriesFrom = 20
	// modelsAge is how many reports of the zone halve every model's
	// count of recent reports: a model nobody names any more reaches 0,
	// and then gives its place to a new one.
	modelsAge = outputWindow
)

// modelEstimates is a zone's table of models. The learner's mutex guards
// it but for byName, which requests read without a lock.
type modelEstimates struct {
	// byName is the table: a map replaced whole when a model comes or
	// goes, never written once published.
	byName atomic.Pointer[map[string]*modelEntry]
	// sinceAged counts the zone's reports since recent counts were halved.
	sinceAged int
}

// modelEntry is one model's series, and how many reports it had recently:
// a new model takes the place of one with none, never of one with some.
type modelEntry struct {
	series outputSeries
	recent int
}

// learn adds a model's output count to its series, making it a place in
// the table if there is one: a free one, or that of a model with no
// recent report. Without one, the model is not kept, and only its zone
// learns from it.
func (m *modelEstimates) learn(model string, output int64, scratch *[outputWindow]int32) {
	if m.sinceAged++; m.sinceAged >= modelsAge {
		m.sinceAged = 0
		for _, e := range m.table() {
			e.recent /= 2
		}
	}
	if model == "" || len(model) > maxModelName {
		return
	}
	e := m.table()[model]
	if e == nil {
		if e = m.admit(model); e == nil {
			return
		}
	}
	e.recent++
	e.series.add(output, scratch)
}

// admit makes a place for a new model, and returns it; nil if every
// place is held by a model with recent reports.
func (m *modelEstimates) admit(model string) *modelEntry {
	table := m.table()
	next := make(map[string]*modelEntry, min(len(table)+1, maxModels))
	maps.Copy(next, table)
	if len(table) >= maxModels {
		idle := ""
		for name, e := range table {
			if e.recent == 0 {
				idle = name
				break
			}
		}
		if idle == "" {
			return nil
		}
		delete(next, idle)
	}
	e := new(modelEntry)
	next[model] = e
	m.byName.Store(&next)
	return e
}

// table returns the models kept now.
func (m *modelEstimates) table() map[string]*modelEntry {
	if t := m.byName.Load(); t != nil {
		return *t
	}
	return nil
}

// learned returns model's learned estimate, 0 if it has none.
func (m *modelEstimates) learned(model string) int64 {
	if e := m.table()[model]; e != nil {
		return e.series.learned.Load()
	}
	return 0
}

// ModelEstimate is one model's output estimate, as the admin API shows it.
type ModelEstimate struct {
	// Model is the name the requests give, as metrics show it.
	Model string `json:"model"`
	// Reports is the reports that taught the estimate since the model
	// was kept.
	Reports int64 `json:"reports"`
	// OutputEstimate is the output tokens a request naming this model and
	// no output counts now, and Learned whether the model's own estimate
	// is learnt (else it counts the zone's).
	OutputEstimate int64 `json:"output_estimate"`
	Learned        bool  `json:"learned"`
}

// shown returns the models with modelSeriesFrom reports or more, with the
// estimate each counts now (zone: the zone's, for those not learnt yet),
// most reports first. The learner's mutex must be held.
func (m *modelEstimates) shown(ceiling, zone int64) []ModelEstimate {
	var out []ModelEstimate
	for name, e := range m.table() {
		if e.series.total < modelSeriesFrom {
			continue
		}
		me := ModelEstimate{Model: core.LabelValue(name), Reports: e.series.total, OutputEstimate: zone}
		if e.series.learned.Load() > 0 {
			me.OutputEstimate, me.Learned = e.series.estimate(ceiling), true
		}
		out = append(out, me)
	}
	slices.SortFunc(out, func(a, b ModelEstimate) int {
		return cmp.Or(cmp.Compare(b.Reports, a.Reports), cmp.Compare(a.Model, b.Model))
	})
	return out
}
