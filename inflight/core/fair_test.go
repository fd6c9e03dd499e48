package core

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestWeightResolution: a positive number is the weight, within 0.001 to
// 1000 (beyond, the nearest bound); anything else counts as 1. Each value
// that is not counted as it reads is logged once, hashed.
func TestWeightResolution(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	g := &Gate{cfg: &Config{Limits: []Limit{{Name: "tenant"}}, Fair: "tenant", Weight: "{http.request.header.X-Weight}"}, logger: zap.New(core)}
	if err := g.compileFair(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		value string
		want  float64
	}{
		{"2.5", 2.5}, {"0.25", 0.25}, {"0.001", 0.001}, {"1000", 1000},
		{"0", 1}, {"-3", 1}, {"abc", 1}, {"abc", 1}, {"NaN", 1}, {"-Inf", 1}, {"", 1}, {"1e-400", 1},
		{"1e-17", 0.001}, {"5e-324", 0.001}, {"1e300", 1000}, {"1e400", 1000}, {"+Inf", 1000}, {"1e300", 1000},
	} {
		if got := g.parseWeight(tc.value); got != tc.want {
			t.Errorf("weight %q: %v, want %v", tc.value, got, tc.want)
		}
	}
	// 0, -3, abc, NaN, -Inf, empty, 1e-400 (0), 1e-17, 5e-324, 1e300,
	// 1e400, +Inf: abc and 1e300 once.
	if n := logs.Len(); n != 12 {
		t.Errorf("%d log lines, want 12 (one per value not counted as it reads)", n)
	}
	for _, e := range logs.All() {
		if v := e.ContextMap()["value"]; v == "abc" || v == "-3" || v == "1e300" {
			t.Errorf("a bad value was logged raw: %v", v)
		}
	}
}

// TestFairNamesALimit: fair must name one of the handler's limits,
// max_waiting_per_key must not be negative, and a weight given as a number
// must be within the bounds.
func TestFairNamesALimit(t *testing.T) {
	for _, c := range []*Config{
		{Limits: []Limit{{Name: "tenant"}}, Fair: "client"},
		{Limits: []Limit{{Name: "tenant"}}, MaxWaitingPerKey: -1},
		{Limits: []Limit{{Name: "tenant"}}, Fair: "tenant", Weight: "5000"},
		{Limits: []Limit{{Name: "tenant"}}, Fair: "tenant", Weight: "0"},
		{Limits: []Limit{{Name: "tenant"}}, Fair: "tenant", Weight: "heavy"},
	} {
		if err := (&Gate{cfg: c}).compileFair(); err == nil {
			t.Errorf("fair %q, max_waiting_per_key %d, weight %q: accepted", c.Fair, c.MaxWaitingPerKey, c.Weight)
		}
	}
	g := &Gate{cfg: &Config{Limits: []Limit{{Name: "client"}, {Name: "tenant"}}, Fair: "tenant", MaxWaitingPerKey: 3}}
	if err := g.compileFair(); err != nil || !g.waitOpt.Fair || g.waitOpt.KeyDim != 1 || g.waitOpt.MaxWaitingPerKey != 3 {
		t.Fatalf("fair tenant: %v, options %+v", err, g.waitOpt)
	}
}
