package llm

import (
	"sync"
	"sync/atomic"
)

// A request whose cost is an estimate in tokens may learn, once it ends,
// how many tokens the model reported it used. Its zone then counts the
// reports (metrics, the admin API), the request's fair charge is set to
// them, and, where it named no output limit, its output count teaches the
// output estimate of the requests that name none (Meter).

// outputLearner learns a zone's output estimate, and one per model its
// requests name (see outputSeries and modelEstimates), from the output
// counts they reported, and sums up how far estimates were from the
// reports.
type outputLearner struct {
	mu      sync.Mutex
	zone    outputSeries
	models  modelEstimates
	scratch [outputWindow]int32 // for the quantile

	ceiling atomic.Int64 // the latest handler's with costs (Join); 0: nobody learns

	reports, reported, estimated, over atomic.Int64
}

// learn adds one output count of a request naming model to the zone's
// series and the model's.
func (l *outputLearner) learn(model string, output int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.zone.add(output, &l.scratch)
	l.models.learn(model, output, &l.scratch)
}

// learned is the estimate a request naming model counts, before its
// ceiling: the model's own, else the zone's; 0 until learnt.
func (l *outputLearner) learned(model string) int64 {
	if e := l.models.learned(model); e > 0 {
		return e
	}
	return l.zone.learned.Load()
}

// count sums up one report against the estimate the request was admitted
// with.
func (l *outputLearner) count(reported, estimated int64) {
	l.reports.Add(1)
	l.reported.Add(reported)
	l.estimated.Add(estimated)
	if reported > estimated {
		l.over.Add(1)
	}
}

// UsageState sums up, for the admin API and the live page, the usage the
// zone's requests reported since it was made against their estimates,
// and the output estimate with default_output auto.
type UsageState struct {
	// Reports is the requests that reported their usage; Reported the
	// tokens they reported (input + output) and Estimated the tokens they
	// were estimated at; Over how many reported more than their estimate.
	Reports   int64 `json:"reports"`
	Reported  int64 `json:"reported_tokens"`
	Estimated int64 `json:"estimated_tokens"`
	Over      int64 `json:"over_estimate"`
	// OutputEstimate is the output tokens a request naming none counts
	// now, and Learned whether it is learnt (else default_output), for
	// the zone: for requests naming a model without an estimate of its
	// own; with default_output auto only.
	OutputEstimate int64 `json:"output_estimate,omitempty"`
	Learned        bool  `json:"learned,omitempty"`
	// Models are the models with 20 reports or more, most reports first,
	// each with the estimate its requests count.
	Models []ModelEstimate `json:"models,omitempty"`
}

func (l *outputLearner) state() *UsageState {
	st := &UsageState{Reports: l.reports.Load(), Reported: l.reported.Load(), Estimated: l.estimated.Load(), Over: l.over.Load()}
	if c := l.ceiling.Load(); c > 0 {
		st.OutputEstimate, st.Learned = l.zone.estimate(c), l.zone.learned.Load() > 0
		l.mu.Lock()
		st.Models = l.models.shown(c, st.OutputEstimate)
		l.mu.Unlock()
	}
	if st.Reports == 0 && st.OutputEstimate == 0 {
		return nil
	}
	return st
}

// State is the zone's usage, as the admin API shows it (core.Extension).
func (l *outputLearner) State() any {
	if st := l.state(); st != nil {
		return st
	}
	return nil // not a nil *UsageState, which would show as null
}
