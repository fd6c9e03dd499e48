package inflight

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// TestCostResolution: a placeholder cost that is a positive integer is the
// cost (one beyond MaxCost counts as MaxCost); anything else is a 500,
// logged once per value, hashed (the value may come from a header).
func TestCostResolution(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	h := &Handler{Cost: "{http.request.header.X-Cost}", logger: zap.New(core)}
	if err := h.compileCost(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		value string
		want  int64 // 0: a 500
	}{
		{"1", 1}, {"32000", 32000}, {"1099511627775", limiter.MaxCost}, {"1099511627776", limiter.MaxCost},
		{"99999999999999999999999", limiter.MaxCost},
		{"0", 0}, {"-5", 0}, {"1.5", 0}, {"abc", 0}, {"abc", 0}, {"", 0}, {" 7", 0}, {"0x10", 0}, {"\xff\xfe", 0},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		if tc.value != "" {
			r.Header.Set("X-Cost", tc.value)
		}
		got, err := h.cost(r)
		var he caddyhttp.HandlerError
		switch {
		case tc.want == 0 && (!errors.As(err, &he) || he.StatusCode != http.StatusInternalServerError):
			t.Errorf("cost %q: %d, %v; want a 500", tc.value, got, err)
		case tc.want != 0 && (err != nil || got != tc.want):
			t.Errorf("cost %q: %d, %v; want %d", tc.value, got, err, tc.want)
		}
	}
	// 0, -5, 1.5, abc (once), empty, " 7", 0x10, \xff\xfe.
	if n := logs.Len(); n != 8 {
		t.Errorf("%d log lines, want 8 (one per bad value)", n)
	}
	for _, e := range logs.All() {
		if v := e.ContextMap()["value"]; v == "abc" || v == "-5" {
			t.Errorf("a bad value was logged raw: %v", v)
		}
	}
}

// TestFixedCostChecked: a fixed cost must be a positive integer up to
// MaxCost.
func TestFixedCostChecked(t *testing.T) {
	for _, c := range []string{"0", "-1", "1.5", "lots", "1099511627776"} {
		h := &Handler{Cost: c}
		if err := h.compileCost(); err == nil {
			t.Errorf("cost %q accepted", c)
		}
	}
	h := &Handler{Cost: "8"}
	if err := h.compileCost(); err != nil {
		t.Fatal(err)
	}
	if n, err := h.cost(httptest.NewRequest("GET", "/", nil)); n != 8 || err != nil {
		t.Fatalf("cost 8: %d, %v", n, err)
	}
}
