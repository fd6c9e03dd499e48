package inflight

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

func init() {
	caddy.RegisterModule(new(holdBackend))
}

// holdBackend answers 200 at once, headers flushed, and with X-Hold holds
// the response open until the test's release channel closes.
type holdBackend struct{}

var holdRelease atomic.Pointer[chan struct{}]

func (*holdBackend) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.inflight_test_hold", New: func() caddy.Module { return new(holdBackend) }}
}

func (*holdBackend) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	w.WriteHeader(http.StatusOK)
	http.NewResponseController(w).Flush()
	if r.Header.Get("X-Hold") != "" {
		<-*holdRelease.Load()
	}
	return nil
}

// serveHandler runs the handler in an in-process Caddy in front of
// holdBackend, and returns its base URL and a function that ends the held
// responses.
func serveHandler(t *testing.T, h map[string]any) (string, func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	release := make(chan struct{})
	holdRelease.Store(&release)
	h["handler"] = "inflight"
	cfg, _ := json.Marshal(map[string]any{
		"admin":   map[string]any{"disabled": true},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}},
		"apps": map[string]any{"http": map[string]any{"servers": map[string]any{"t": map[string]any{
			"listen": []string{addr},
			"routes": []any{map[string]any{"handle": []any{h, map[string]any{"handler": "inflight_test_hold"}}}},
		}}}},
	})
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatal(err)
	}
	once := make(chan struct{})
	end := func() {
		select {
		case <-once:
		default:
			close(once)
			close(release)
		}
	}
	t.Cleanup(func() {
		end()
		caddy.Stop()
	})
	return "http://" + addr, end
}

// fetch sends a GET with the headers given as name, value pairs and
// returns its response, whose body (held or not) is left open.
func fetch(t *testing.T, url string, header ...string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestLimitHeadersShowEachKeysLevel: each response, admitted or refused,
// carries the cap of every limit named in limit_headers and the units its
// key has left, in the shape of the IETF RateLimit fields; a request
// without a key for a limit gets no member for it, and no key is shown.
func TestLimitHeadersShowEachKeysLevel(t *testing.T) {
	url, release := serveHandler(t, map[string]any{
		"zone":          "levels",
		"limits":        []any{map[string]any{"name": "tenant", "key": "{http.request.header.X-Tenant}", "max": 3}, map[string]any{"name": "client", "max": 100}},
		"total":         5,
		"limit_headers": []string{"tenant", "total"},
	})
	const unit = `;qu="concurrent-requests"`
	var held int64
	for i, tc := range []struct {
		tenant, hold   string
		status         int
		policy, remain string
	}{
		{"secret-a", "1", 200, `"tenant";q=3` + unit + `, "total";q=5` + unit, `"tenant";r=2, "total";r=4`},
		{"secret-a", "1", 200, `"tenant";q=3` + unit + `, "total";q=5` + unit, `"tenant";r=1, "total";r=3`},
		{"secret-b", "", 200, `"tenant";q=3` + unit + `, "total";q=5` + unit, `"tenant";r=2, "total";r=2`},
		{"secret-a", "1", 200, `"tenant";q=3` + unit + `, "total";q=5` + unit, `"tenant";r=0, "total";r=2`},
		{"secret-a", "", 429, `"tenant";q=3` + unit + `, "total";q=5` + unit, `"tenant";r=0, "total";r=2`},
		{"", "1", 200, `"total";q=5` + unit, `"total";r=1`},
		{"secret-b", "1", 200, `"tenant";q=3` + unit + `, "total";q=5` + unit, `"tenant";r=2, "total";r=0`},
		{"secret-b", "", 429, `"tenant";q=3` + unit + `, "total";q=5` + unit, `"tenant";r=2, "total";r=0`},
	} {
		resp := fetch(t, url, "X-Tenant", tc.tenant, "X-Hold", tc.hold)
		if tc.hold == "" || resp.StatusCode != http.StatusOK {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		} else {
			held++
		}
		eventually(t, "the requests not held end", func() bool { return inFlight("levels") == held })
		policy, remain := resp.Header.Get("RateLimit-Policy"), resp.Header.Get("RateLimit")
		if resp.StatusCode != tc.status || policy != tc.policy || remain != tc.remain {
			t.Errorf("request %d (tenant %q): %d with\n\tRateLimit-Policy: %s\n\tRateLimit: %s\nwant %d with\n\tRateLimit-Policy: %s\n\tRateLimit: %s",
				i+1, tc.tenant, resp.StatusCode, policy, remain, tc.status, tc.policy, tc.remain)
		}
		if strings.Contains(fmt.Sprint(resp.Header), "secret") {
			t.Errorf("request %d: a key is shown: %v", i+1, resp.Header)
		}
	}
	release()
}

// TestLimitHeadersUseTheCapEnforced: a placeholder max is the request's
// own, and each of n replicas enforces ceil(max/n): that is the quota
// shown. A handler without limit_headers sends no field.
func TestLimitHeadersUseTheCapEnforced(t *testing.T) {
	url, _ := serveHandler(t, map[string]any{
		"zone":          "levels-cap",
		"limits":        []any{map[string]any{"name": "tenant", "key": "{http.request.header.X-Tenant}", "max": "{http.request.header.X-Max}"}},
		"replicas":      2,
		"limit_headers": []string{"tenant"},
	})
	resp := fetch(t, url, "X-Tenant", "a", "X-Max", "7")
	resp.Body.Close()
	if got, want := resp.Header.Get("RateLimit-Policy")+" / "+resp.Header.Get("RateLimit"), `"tenant";q=4;qu="concurrent-requests" / "tenant";r=3`; got != want {
		t.Errorf("max 7 over 2 replicas: %s, want %s", got, want)
	}
	caddy.Stop()

	url, _ = serveHandler(t, map[string]any{"zone": "levels-none", "limits": []any{map[string]any{"name": "client", "max": 1}}})
	resp = fetch(t, url)
	resp.Body.Close()
	if _, ok := resp.Header["Ratelimit"]; ok || resp.Header.Get("RateLimit-Policy") != "" {
		t.Errorf("without limit_headers: %v", resp.Header)
	}
}

// TestLimitHeadersNameLimits: limit_headers must name the handler's limits
// or its total, each once, with a shared store too.
func TestLimitHeadersNameLimits(t *testing.T) {
	limits := []core.Limit{{Name: "client"}, {Name: "tenant"}}
	for _, tc := range []struct {
		h    *Handler
		want string
	}{
		{&Handler{Config: core.Config{Limits: limits}, LimitHeaders: []string{"tenants"}}, `limit_headers "tenants" is not allowed: want the names of this handler's limits ["client" "tenant"]`},
		{&Handler{Config: core.Config{Limits: limits}, LimitHeaders: []string{"total"}}, `limit_headers "total" is not allowed`},
		{&Handler{Config: core.Config{Limits: limits, Total: 5}, LimitHeaders: []string{"nope"}}, `["client" "tenant" "total"]`},
		{&Handler{Config: core.Config{Limits: limits}, LimitHeaders: []string{"tenant", "tenant"}}, `limit_headers "tenant" is given twice`},
	} {
		if err := tc.h.compileLimitHeaders(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("limit_headers %q: %v, want an error containing %s", tc.h.LimitHeaders, err, tc.want)
		}
	}
	h := &Handler{Config: core.Config{Limits: limits}, TotalAdaptive: &AdaptiveTotal{}, LimitHeaders: []string{"total", "client"}}
	if err := h.compileLimitHeaders(); err != nil || fmt.Sprint(h.levels) != fmt.Sprint([]int{-1, 0}) {
		t.Errorf("total adaptive, limit_headers total client: %v, dimensions %v", err, h.levels)
	}
	h.StoreRaw = json.RawMessage(`{"type":"redis"}`)
	if err := h.compileLimitHeaders(); err != nil || fmt.Sprint(h.levels) != fmt.Sprint([]int{-1, 0}) || !h.shared {
		t.Errorf("with a store: %v, dimensions %v, shared %v; want the same dimensions, shared", err, h.levels, h.shared)
	}
}

// TestLimitHeadersFromTheFleet: with a store, the fields show the fleet's
// level as the store answered (its cap, not this instance's share, and the
// units held across the fleet); a limit the store did not read is left
// out, and nothing is sent when it answered nothing.
func TestLimitHeadersFromTheFleet(t *testing.T) {
	h := &Handler{Config: core.Config{Limits: []core.Limit{{Name: "client"}, {Name: "tenant"}}, Total: 9}, LimitHeaders: []string{"tenant", "total"}}
	h.StoreRaw = json.RawMessage(`{"type":"redis"}`)
	if err := h.compileLimitHeaders(); err != nil {
		t.Fatal(err)
	}
	a := &admission{}
	a.ticket.Req.Keys = []string{"1.2.3.4", "secret-a"}
	const unit = `;qu="concurrent-requests"`
	for _, tc := range []struct {
		what           string
		res            limiter.Result
		policy, remain string
	}{
		{"admitted", limiter.Result{Levels: limiter.Levels{{Cap: 100, InFlight: 1}, {Cap: 5, InFlight: 4}, {Cap: 9, InFlight: 7}}},
			`"tenant";q=5` + unit + `, "total";q=9` + unit, `"tenant";r=1, "total";r=2`},
		{"refused by the tenant, the total not read", limiter.Result{Outcome: limiter.Full, Dim: 1, Levels: limiter.Levels{{Cap: 100, InFlight: 1}, {Cap: 5, InFlight: 6}, {}}},
			`"tenant";q=5` + unit, `"tenant";r=0`},
		{"no answer (max_keys)", limiter.Result{Outcome: limiter.KeysFull}, "", ""},
		{"the client left", limiter.Result{Outcome: limiter.Aborted, Levels: limiter.Levels{{Cap: 1}, {Cap: 1}, {Cap: 1}}}, "", ""},
	} {
		w := httptest.NewRecorder()
		h.sendLevels(w, a, tc.res)
		if p, r := w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"); p != tc.policy || r != tc.remain {
			t.Errorf("%s:\n\tRateLimit-Policy: %s\n\tRateLimit: %s\nwant\n\tRateLimit-Policy: %s\n\tRateLimit: %s", tc.what, p, r, tc.policy, tc.remain)
		}
	}
}

// inFlight returns the requests in flight in the zone named label, by its
// total.
func inFlight(label string) int64 {
	var n int64
	for _, z := range core.States() {
		if z.Zone == label && z.Total != nil {
			n += *z.Total
		}
	}
	return n
}

// eventually polls cond until it holds, failing the test after 10 s: a
// bound against hanging, not a measure of speed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 10s", what)
		}
	}
}
