package inflight

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
)

// Which requests are gRPC, and the content type their refusal carries.
func TestGRPCContentType(t *testing.T) {
	for ct, want := range map[string]string{
		"application/grpc":                            "application/grpc",
		"application/grpc+proto":                      "application/grpc+proto",
		"Application/GRPC+JSON":                       "application/grpc+json",
		"application/grpc; charset=utf-8":             "application/grpc",
		"application/grpc+proto;foo=bar":              "application/grpc+proto",
		"application/grpc+":                           "application/grpc",
		"application/grpc+a/b":                        "", // not a media type
		"application/grpc+p%rot":                      "application/grpc",
		"application/grpc-web":                        "application/grpc-web",
		"application/grpc-web+proto":                  "application/grpc-web+proto",
		"application/grpc-web-text":                   "application/grpc-web-text",
		"application/grpc-web-text+proto":             "application/grpc-web-text+proto",
		"APPLICATION/GRPC-WEB-TEXT+PROTO; x=1":        "application/grpc-web-text+proto",
		"application/grpcx":                           "",
		"application/grpc-webx":                       "",
		"application/grpc-gateway":                    "",
		"application/json":                            "",
		"text/plain":                                  "",
		"":                                            "",
		"application/gr":                              "",
		"application/grpc;;":                          "",
		"application/grpc+" + strings.Repeat("a", 65): "application/grpc",
	} {
		r := httptest.NewRequest(http.MethodPost, "/svc/Method", nil)
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		if got := grpcContentType(r); got != want {
			t.Errorf("Content-Type %q: refusal content type %q, want %q", ct, got, want)
		}
	}
}

// grpc-message is percent-encoded as PROTOCOL-HTTP2.md says: bytes outside
// 0x20-0x7E and % as upper-case %XX, UTF-8 byte by byte.
func TestGRPCPercentEncode(t *testing.T) {
	for in, want := range map[string]string{
		"inflight: limit client refused the request (full)": "inflight: limit client refused the request (full)",
		"100%":         "100%25",
		"a\nb\tc\x7f":  "a%0Ab%09c%7F",
		"~ !":          "~ !",
		"café ✓":       "caf%C3%A9 %E2%9C%93",
		"":             "",
		"%%":           "%25%25",
		"\x00\x1f\x20": "%00%1F ",
	} {
		if got := grpcPercentEncode(in); got != want {
			t.Errorf("grpcPercentEncode(%q) = %q, want %q", in, got, want)
		}
	}
}

// The refusal of a gRPC request: HTTP 200, no body, the status, message
// and pushback in the header block; the placeholders set as for HTTP; no
// Caddy error, so handle_errors does not run.
func TestGRPCRefusalShape(t *testing.T) {
	for _, tc := range []struct {
		option, ct, wantCT, code string
		retryAfter               time.Duration
		retryAfterMs             string
		pushback                 string
	}{
		{"", "application/grpc", "application/grpc", "8", time.Second, "", "1000"},
		{GRPCResourceExhausted, "application/grpc+proto", "application/grpc+proto", "8", 2500 * time.Millisecond, "", "2500"},
		{GRPCUnavailable, "application/grpc", "application/grpc", "14", 1500 * time.Microsecond, "", "1"},
		{GRPCUnavailable, "application/grpc-web-text", "application/grpc-web-text", "14", time.Minute, "", "60000"},
		{"", "application/grpc-web+proto; charset=x", "application/grpc-web+proto", "8", time.Second, "", "1000"},
		{"", "application/grpc", "application/grpc", "8", 2 * time.Second, "250ms", "250"}, // retry_after_ms's, not retry_after's
	} {
		h := &Handler{GRPCStatus: tc.option, RetryAfter: caddy.Duration(tc.retryAfter), RetryAfterMs: tc.retryAfterMs}
		h.setDefaults()
		if err := h.compileRetryAfterMs(); err != nil {
			t.Fatal(err)
		}
		r, repl := request("192.0.2.1:1234", "Content-Type", tc.ct)
		w := httptest.NewRecorder()
		err := h.refuse(w, r, core.Verdict{Limit: "tenant", Reason: "queue_full"})
		if err != nil {
			t.Errorf("%s %q: refuse returned %v: a Caddy error would run handle_errors", tc.option, tc.ct, err)
		}
		res := w.Result()
		want := map[string]string{
			"Content-Type":           tc.wantCT,
			"Grpc-Status":            tc.code,
			"Grpc-Message":           "inflight: limit tenant refused the request (queue_full)",
			"Grpc-Retry-Pushback-Ms": tc.pushback,
			"Content-Length":         "0",
			"Retry-After":            "",
		}
		if res.StatusCode != http.StatusOK {
			t.Errorf("%s %q: HTTP %d, want 200", tc.option, tc.ct, res.StatusCode)
		}
		for k, v := range want {
			if got := res.Header.Get(k); got != v {
				t.Errorf("%s %q: %s %q, want %q", tc.option, tc.ct, k, got, v)
			}
		}
		if w.Body.Len() != 0 || len(res.Trailer) != 0 {
			t.Errorf("%s %q: body %q, trailers %v: a Trailers-Only response has neither", tc.option, tc.ct, w.Body.Bytes(), res.Trailer)
		}
		if l, _ := repl.GetString("http.inflight.limit"); l != "tenant" {
			t.Errorf("{http.inflight.limit} = %q", l)
		}
		if l, _ := repl.GetString("http.inflight.reason"); l != "queue_full" {
			t.Errorf("{http.inflight.reason} = %q", l)
		}
	}

	// Any other request is refused as before: a Caddy error with the
	// status, and Retry-After.
	h := &Handler{GRPCStatus: GRPCUnavailable, StatusCode: 503}
	h.setDefaults()
	h.retryAfter = "1"
	r, _ := request("192.0.2.1:1234", "Content-Type", "application/json")
	w := httptest.NewRecorder()
	err := h.refuse(w, r, core.Verdict{Limit: "client", Reason: "full"})
	var he caddyhttp.HandlerError
	if !errors.As(err, &he) || he.StatusCode != 503 {
		t.Fatalf("non-gRPC refusal: %v, want a Caddy error with 503", err)
	}
	if w.Header().Get("Retry-After") != "1" || w.Header().Get("Grpc-Status") != "" {
		t.Fatalf("non-gRPC refusal headers: %v", w.Header())
	}
}

// A grpc_status that is not a name Caddy knows refuses the config, naming
// the field, the value and what is allowed.
func TestGRPCStatusOption(t *testing.T) {
	for _, ok := range []string{"", GRPCResourceExhausted, GRPCUnavailable} {
		if err := CheckGRPCStatus(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	const allowed = `want resource_exhausted (gRPC code 8, the default) or unavailable (code 14)`
	for _, bad := range []string{"UNAVAILABLE", "8", "aborted", " unavailable"} {
		err := (&Handler{StatusCode: 429, GRPCStatus: bad}).Validate()
		if err == nil || !strings.Contains(err.Error(), `inflight: grpc_status "`+bad+`" is not allowed: `+allowed) {
			t.Errorf("grpc_status %q: %v", bad, err)
		}
	}
	cfg := `{"admin": {"disabled": true}, "logging": {"logs": {"default": {"level": "ERROR"}}},
		"apps": {"http": {"servers": {"t": {"listen": ["127.0.0.1:0"], "routes": [{"handle": [
			{"handler": "inflight", "limits": [{"name": "c", "max": 1}], "grpc_status": "cancelled"}]}]}}}}}`
	err := caddy.Load([]byte(cfg), true)
	if err == nil {
		caddy.Stop()
		t.Fatal("Caddy started with grpc_status cancelled")
	}
	if !strings.Contains(err.Error(), `grpc_status "cancelled" is not allowed: `+allowed) {
		t.Fatalf("load error %q does not name the field, value and what is allowed", err)
	}
}
