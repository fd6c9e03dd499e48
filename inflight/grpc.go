package inflight

import (
	"fmt"
	"mime"
	"net/http"
	"strings"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
)

// The values of Handler.GRPCStatus.
const (
	GRPCResourceExhausted = "resource_exhausted" // code 8, the default
	GRPCUnavailable       = "unavailable"        // code 14
)

// grpcCodes maps the names GRPCStatus allows to their gRPC status codes.
var grpcCodes = map[string]string{
	GRPCResourceExhausted: "8",
	GRPCUnavailable:       "14",
}

// CheckGRPCStatus refuses a GRPCStatus that is not one of the names
// allowed ("" is the default).
func CheckGRPCStatus(v string) error {
	if _, ok := grpcCodes[v]; ok || v == "" {
		return nil
	}
	return fmt.Errorf("grpc_status %q is not allowed: want %s (gRPC code 8, the default) or %s (code 14)", v, GRPCResourceExhausted, GRPCUnavailable)
}

// grpcContentType returns the content type of a refusal of r if r is a gRPC
// or gRPC-Web request (application/grpc, application/grpc+proto,
// application/grpc-web, application/grpc-web-text+proto, ..., any case,
// parameters ignored), and "" otherwise. The request's own type is echoed,
// lower-cased and without parameters, when its subtype is a plain token;
// else the bare type of its protocol.
func grpcContentType(r *http.Request) string {
	ct := r.Header.Get("Content-Type")
	if len(ct) < len("application/grpc") || !strings.EqualFold(ct[:len("application/grpc")], "application/grpc") {
		return "" // the fast path: every other request
	}
	media, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return ""
	}
	// media is lower-cased by ParseMediaType.
	for _, base := range [...]string{"application/grpc-web-text", "application/grpc-web", "application/grpc"} {
		rest, ok := strings.CutPrefix(media, base)
		switch {
		case !ok:
			continue
		case rest == "":
			return base
		case rest[0] != '+':
			return "" // application/grpcfoo, application/grpc-webx
		case plainToken(rest[1:]):
			return media
		default:
			return base
		}
	}
	return ""
}

// plainToken reports whether s is a non-empty run of letters, digits and
// - . _, as a codec name such as proto or json is.
func plainToken(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_') {
			return false
		}
	}
	return true
}

// refuseGRPC answers a gRPC or gRPC-Web request over its cap as gRPC does:
// a Trailers-Only response, HTTP 200 whose header block carries
// grpc-status, grpc-message and grpc-retry-pushback-ms and ends the stream
// (no body, no trailers), the form gRPC-Web also accepts. It is written
// here, not returned as a Caddy error: handle_errors would answer with a
// status and body no gRPC client reads.
func (h *Handler) refuseGRPC(w http.ResponseWriter, contentType string, v core.Verdict) {
	hdr := w.Header()
	hdr.Set("Content-Type", contentType)
	code := grpcCodes[h.GRPCStatus]
	if code == "" {
		code = grpcCodes[GRPCResourceExhausted]
	}
	hdr.Set("Grpc-Status", code)
	hdr.Set("Grpc-Message", grpcPercentEncode("inflight: limit "+v.Limit+" refused the request ("+v.Reason+")"))
	pushback, _ := h.retryMillis() // gRFC A6, in ms: retry_after_ms's if set
	hdr.Set("Grpc-Retry-Pushback-Ms", pushback)
	// A Trailers-Only response has no body; over HTTP/1.1 (gRPC-Web) the
	// length ends it, over HTTP/2 the end of the handler ends the stream
	// with the header block.
	hdr.Set("Content-Length", "0")
	w.WriteHeader(http.StatusOK)
}

// grpcPercentEncode encodes a grpc-message value as the gRPC spec
// (PROTOCOL-HTTP2.md) requires: each byte outside printable ASCII
// (0x20-0x7E), and %, as %XX, upper-case hex; UTF-8 is encoded byte by
// byte.
func grpcPercentEncode(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '%' {
			n++
		}
	}
	if n == 0 {
		return s
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '%' {
			b = append(b, '%', hex[c>>4], hex[c&15])
		} else {
			b = append(b, c)
		}
	}
	return string(b)
}
