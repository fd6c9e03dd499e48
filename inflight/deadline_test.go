package inflight

import (
	"math"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestParseGRPCTimeout(t *testing.T) {
	for _, c := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"300m", 300 * time.Millisecond, true},
		{"1S", time.Second, true},
		{"2M", 2 * time.Minute, true},
		{"1H", time.Hour, true},
		{"5u", 5 * time.Microsecond, true},
		{"7n", 7, true},
		{"0m", 0, true},
		{"99999999n", 99999999, true},
		{"99999999H", time.Duration(math.MaxInt64), true}, // beyond a Duration
		{"999999999m", 0, false},                          // 9 digits
		{"", 0, false}, {"m", 0, false}, {"10", 0, false}, {"10s", 0, false},
		{"-1S", 0, false}, {"+1S", 0, false}, {"1.5S", 0, false}, {" 1S", 0, false},
		{"1 S", 0, false}, {"１S", 0, false}, {"\x00S", 0, false}, {"1SS", 0, false},
	} {
		got, ok := parseGRPCTimeout(c.v)
		if got != c.want || ok != c.ok {
			t.Errorf("parseGRPCTimeout(%q) = %s, %v; want %s, %v", c.v, got, ok, c.want, c.ok)
		}
	}
}

func TestParseDeadline(t *testing.T) {
	for _, c := range []struct {
		v    string
		want time.Duration // 0: refused
	}{
		{"300ms", 300 * time.Millisecond}, {"1.5s", 1500 * time.Millisecond}, {"2m", 2 * time.Minute},
		{"0.3", 300 * time.Millisecond}, {"30", 30 * time.Second}, {"1e400", time.Duration(math.MaxInt64)},
		{"1e300", time.Duration(math.MaxInt64)}, {"Inf", time.Duration(math.MaxInt64)},
		{"0", 0}, {"0s", 0}, {"-1s", 0}, {"-0.5", 0}, {"NaN", 0}, {"soon", 0}, {"", 0}, {"1e-400", 0}, {"5 s", 0},
	} {
		got, err := parseDeadline(c.v)
		if (err == nil) != (c.want != 0) || got != c.want {
			t.Errorf("parseDeadline(%q) = %s, %v; want %s", c.v, got, err, c.want)
		}
	}
}

// Hostile grpc-timeout values never panic: they parse or are refused.
func FuzzGRPCTimeout(f *testing.F) {
	for _, s := range []string{"1S", "99999999H", "", "\xff", "1\x00n", strings.Repeat("9", 100) + "n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := parseGRPCTimeout(v)
		if ok && d < 0 {
			t.Fatalf("%q parsed as %s", v, d)
		}
		if !ok && d != 0 {
			t.Fatalf("%q refused with %s", v, d)
		}
	})
}

// A request's deadline is the shorter of the Deadline placeholder's value
// and, for gRPC, its grpc-timeout; bad values of either are ignored, each
// logged once.
func TestDeadlineOf(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	h := &Handler{logger: zap.New(core)}
	h.Deadline = "{http.request.header.X-Request-Timeout}"
	h.deadline = compileTemplate(h.Deadline)
	grpc := func(to, timeout string) []string {
		return []string{"Content-Type", "application/grpc+proto", "Grpc-Timeout", to, "X-Request-Timeout", timeout}
	}
	for _, c := range []struct {
		header []string
		want   time.Duration
		ok     bool
	}{
		{[]string{"X-Request-Timeout", "300ms"}, 300 * time.Millisecond, true},
		{[]string{"X-Request-Timeout", "0.5"}, 500 * time.Millisecond, true},
		{[]string{"X-Request-Timeout", "banana"}, 0, false},
		{[]string{"X-Request-Timeout", "banana"}, 0, false}, // logged once
		{nil, 0, false},
		{grpc("100m", "1s"), 100 * time.Millisecond, true},
		{grpc("5S", "1s"), time.Second, true},
		{grpc("5S", ""), 5 * time.Second, true},
		{grpc("1x", "2s"), 2 * time.Second, true},
		{grpc("1x", ""), 0, false},
		{[]string{"Grpc-Timeout", "1m"}, 0, false}, // not gRPC
	} {
		r, _ := request("192.0.2.1:1234", c.header...)
		got, ok := h.deadlineOf(r)
		if got != c.want || ok != c.ok {
			t.Errorf("%q: %s, %v; want %s, %v", c.header, got, ok, c.want, c.ok)
		}
	}
	if n := logs.FilterMessageSnippet("deadline placeholder").Len(); n != 1 {
		t.Errorf("bad deadline logged %d times, want once", n)
	}
	if n := logs.FilterMessageSnippet("malformed grpc-timeout").Len(); n != 1 {
		t.Errorf("bad grpc-timeout logged %d times, want once", n)
	}
}
