package inflight

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestUIHandlerPaths: mounted on a site, the page is at the handled path
// ending in `/`, its state and files beside it; a path without the `/` is
// sent to it, relative to where the browser is (a prefix may have been
// stripped).
func TestUIHandlerPaths(t *testing.T) {
	for _, tc := range []struct{ path, original, want string }{
		{"/live/", "", "text/html; charset=utf-8"},
		{"/live/state", "", "application/json"},
		{"/live/ui.js", "", "text/javascript; charset=utf-8"},
		{"/live", "", "302 live/"},
		{"/", "/status/", "text/html; charset=utf-8"}, // handle_path /status/*
		{"/state", "/status/state", "application/json"},
		{"", "/status", "302 status/"},
	} {
		r := httptest.NewRequest(http.MethodGet, "http://example.com"+cmpOr(tc.original, tc.path), nil)
		r.URL.Path = tc.path
		if tc.original != "" {
			orig := r.Clone(r.Context())
			orig.URL.Path = tc.original
			r = r.WithContext(context.WithValue(r.Context(), caddyhttp.OriginalRequestCtxKey, *orig))
		}
		w := httptest.NewRecorder()
		if err := new(UI).ServeHTTP(w, r, nil); err != nil {
			t.Fatal(err)
		}
		got := w.Header().Get("Content-Type")
		if w.Code == http.StatusFound {
			got = "302 " + w.Header().Get("Location")
		}
		if got != tc.want {
			t.Errorf("GET %s (originally %q): %q, want %q", tc.path, tc.original, got, tc.want)
		}
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
