package core

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// TestAdminPaths: the admin API answers its state, its page and the page's
// files, and 404 on any other path under /inflight/ (not the state on
// every one).
func TestAdminPaths(t *testing.T) {
	a := new(AdminAPI)
	for path, want := range map[string]string{
		"/inflight/":       "application/json",
		"/inflight/state":  "application/json",
		"/inflight/ui":     "text/html; charset=utf-8",
		"/inflight/ui.js":  "text/javascript; charset=utf-8",
		"/inflight/ui.css": "text/css; charset=utf-8",
		"/inflight/nope":   "404",
		"/inflight/ui/":    "404",
		"/inflight/zones":  "404",
	} {
		w := httptest.NewRecorder()
		err := a.serve(w, httptest.NewRequest(http.MethodGet, path, nil))
		got := w.Header().Get("Content-Type")
		if apiErr, ok := err.(caddy.APIError); ok {
			got = http.StatusText(apiErr.HTTPStatus)
			if apiErr.HTTPStatus == http.StatusNotFound {
				got = "404"
			}
		}
		if got != want {
			t.Errorf("GET %s: %q (error %v), want %q", path, got, err, want)
		}
		if strings.HasPrefix(want, "text/") && !strings.Contains(w.Header().Get("Content-Security-Policy"), "default-src 'none'") {
			t.Errorf("GET %s: Content-Security-Policy %q, want default-src 'none'", path, w.Header().Get("Content-Security-Policy"))
		}
	}
}

// TestPageWritesNoHTML: the script never turns data into markup; keys may
// be anything a client sent. (The browser test checks it in Chromium.)
func TestPageWritesNoHTML(t *testing.T) {
	js, err := uiFiles.ReadFile("ui/ui.js")
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function`).Find(js); m != nil {
		t.Fatalf("ui.js uses %s", m)
	}
	page, _ := uiFiles.ReadFile("ui/index.html")
	if regexp.MustCompile(`<script>|<style|\sstyle=|\son[a-z]+=|https?://`).Match(page) {
		t.Fatal("index.html has inline script or style, an event attribute, or an external URL")
	}
}

// TestWaitPercentiles: waits are counted in the histogram's buckets and
// percentiles interpolated within them, up to the longest wait of the
// bucket, so none exceeds the longest wait; waits older than two minutes
// drop out.
func TestWaitPercentiles(t *testing.T) {
	var w waitWindow
	start := time.Unix(1000, 0)
	for i := range 100 {
		s := 0.003 // bucket (0.001, 0.005]
		if i >= 90 {
			s = 0.7 // bucket (0.5, 1]
		}
		w.observe(start, s)
	}
	got := w.state(start.Add(30 * time.Second))
	want := WaitState{Count: 100, P50: 0.001 + 0.002*50/90, P90: 0.003, P99: 0.5 + 0.2*9/10}
	if got.Count != want.Count || !near(got.P50, want.P50) || !near(got.P90, want.P90) || !near(got.P99, want.P99) {
		t.Fatalf("state %+v, want %+v", got, want)
	}
	if got := w.state(start.Add(90 * time.Second)); got.Count != 100 {
		t.Fatalf("after 90 s: %d waits, want the 100 of the previous minute", got.Count)
	}
	w.observe(start.Add(100*time.Second), 200) // beyond the last bucket
	if got := w.state(start.Add(200 * time.Second)); got.Count != 1 || got.P50 != 120 {
		t.Fatalf("after 200 s: %+v, want only the latest wait, at the last bound (120)", got)
	}
	if got := w.state(start.Add(time.Hour)); got != (WaitState{}) {
		t.Fatalf("an hour later: %+v, want none", got)
	}

	// wait 1s: every wait times out just after 1 s, in the bucket up to
	// 2.5 s.
	var timeouts waitWindow
	longest := 0.0
	for i := range 100 {
		longest = 1.0001 + float64(i)*1e-6
		timeouts.observe(start, longest)
	}
	got = timeouts.state(start)
	for _, p := range []float64{got.P50, got.P90, got.P99} {
		if p <= 1 || p > longest {
			t.Fatalf("waits of 1.0001 to %.6f s: %+v, want each percentile within them", longest, got)
		}
	}
}

func near(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 }
