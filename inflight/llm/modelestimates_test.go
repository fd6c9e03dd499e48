package llm

import (
	"fmt"
	"strings"
	"testing"
)

// TestModelTableIsBounded: a zone keeps at most maxModels models, and a
// new name takes the place of a model only once that model has had no
// recent report (its count halved every 1,000 reports of the zone): a
// flood of new names never evicts a model with more reports. A name too
// long is not kept. A model not kept teaches and counts the zone's
// estimate.
func TestModelTableIsBounded(t *testing.T) {
	var l outputLearner
	l.learn("rare", 7)             // one report
	for i := range maxModels - 1 { // 946 reports in all: the counts are not halved yet
		for range 15 {
			l.learn(fmt.Sprint("model-", i), 100)
		}
	}
	if n := len(l.models.table()); n != maxModels {
		t.Fatalf("%d models kept, want %d", n, maxModels)
	}
	l.learn(strings.Repeat("m", maxModelName+1), 5)
	for i := range 40 {
		l.learn(fmt.Sprint("flood-", i), 5)
	}
	table := l.models.table()
	if len(table) != maxModels || table["rare"] == nil || table["flood-0"] != nil {
		t.Fatalf("after a flood of new names: %d models, rare kept %v, a new name kept %v; want %d, the same models",
			len(table), table["rare"] != nil, table["flood-0"] != nil, maxModels)
	}
	// The zone's 1,000th report (after-0's) halves every count: rare's goes
	// to 0, the others' to 7 or more; after-0 takes rare's place, and no
	// new name after it takes another.
	for l.models.sinceAged < modelsAge-1 {
		l.learn("model-0", 100)
	}
	for i := range 100 {
		l.learn(fmt.Sprint("after-", i), 5)
	}
	table = l.models.table()
	if len(table) != maxModels || table["rare"] != nil || table["after-0"] == nil || table["after-1"] != nil {
		t.Fatalf("after the counts were halved: %d models, rare kept %v, after-0 %v, after-1 %v; want %d, after-0 in rare's place",
			len(table), table["rare"] != nil, table["after-0"] != nil, table["after-1"] != nil, maxModels)
	}
	for i := range maxModels - 1 {
		if table[fmt.Sprint("model-", i)] == nil {
			t.Fatalf("model-%d, with more reports, was evicted", i)
		}
	}
	if got := l.learned("flood-7"); got == 0 || got != l.zone.learned.Load() {
		t.Errorf("a model not kept: estimate %d, want the zone's, %d", got, l.zone.learned.Load())
	}
}

// TestModelEstimatesShown: a model is shown (admin API, metrics) from its
// 20th report, with the zone's estimate until its own is learnt at its
// 25th, most reports first.
func TestModelEstimatesShown(t *testing.T) {
	var l outputLearner
	l.ceiling.Store(1024)
	for range 30 {
		l.learn("busy", 50)
	}
	for range modelSeriesFrom - 1 {
		l.learn("new", 900)
	}
	st := l.state()
	if len(st.Models) != 1 || st.Models[0] != (ModelEstimate{Model: "busy", Reports: 30, OutputEstimate: 50, Learned: true}) {
		t.Fatalf("models %+v, want only busy, learnt at 50 (new has 19 reports)", st.Models)
	}
	l.learn("new", 900)
	st = l.state()
	want := []ModelEstimate{{Model: "busy", Reports: 30, OutputEstimate: 50, Learned: true}, {Model: "new", Reports: 20, OutputEstimate: st.OutputEstimate}}
	if len(st.Models) != 2 || st.Models[0] != want[0] || st.Models[1] != want[1] || !st.Learned {
		t.Fatalf("models %+v, want %+v (new shown with the zone's estimate)", st.Models, want)
	}
}
