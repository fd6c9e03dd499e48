package browser

import (
	"bytes"
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"image/png"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"golang.org/x/crypto/bcrypt"
)

// updateScreenshot makes TestLivePage write the page where the README
// shows it; otherwise the picture goes to the test's temporary folder, so a
// run leaves the checkout as it was.
var updateScreenshot = flag.Bool("update-screenshot", false, "write docs/live-page.png")

// evilKey is a tenant that would run script if the page ever put a key in
// HTML.
const evilKey = `<img src=x onerror="document.title='pwned'">`

// The waits are generous: the page polls every second, and the machine
// may be busy.
const within = 20 * time.Second

// TestLivePage opens the live page, mounted on a site behind basic_auth, in
// Chromium, and watches it follow the traffic: requests held by the backend
// show as in flight, requests over the caps as waiting, refused ones as
// refusals, and all go back to zero when the backend lets them go. Keys are
// shown as text, the charts move, and the admin endpoint serves the same
// page.
func TestLivePage(t *testing.T) {
	b := newBackend(t)
	port := freePort(t)
	site := fmt.Sprintf("http://127.0.0.1:%d", port)
	hash, err := bcrypt.GenerateFromPassword([]byte("secret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	redisAddr, stopRedis := startRedis(t)
	load(t, fmt.Sprintf(`%s {
	handle /inflight/* {
		basic_auth {
			admin %s
		}
		inflight_ui
	}
	handle /fleet/* {
		inflight {
			total 10
			zone fleet
			store redis {
				address %s
				timeout 100ms
			}
		}
		respond "ok"
	}
	handle /adaptive/* {
		inflight {
			total adaptive
			zone backend-adaptive
		}
		reverse_proxy %s
	}
	handle {
		inflight {
			limit tenant {header.X-Tenant} 2
			total 4
			zone api
			wait 30s
			max_waiting 3
			metrics per_key plain
		}
		reverse_proxy %s
	}
}
`, site, hash, redisAddr, b.addr, b.addr))

	checkHeaders(t, site)

	ctx := browser(t)
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:secret"))
	// Tall enough for the whole page: no scroll bar narrows it.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1400, 1300), headers(network.Headers{"Authorization": auth})); err != nil {
		t.Fatal(err)
	}
	resp, err := chromedp.RunResponse(ctx, chromedp.Navigate(site+"/inflight/"))
	if err != nil {
		t.Fatal(err)
	}
	if csp, _ := resp.Headers["Content-Security-Policy"].(string); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("the browser got the page with Content-Security-Policy %q", csp)
	}
	field := func(zone, name string) string {
		js := fmt.Sprintf(`(() => { const e = document.querySelector('[data-zone=%q] [data-field=%q]'); return e ? e.textContent : '' })()`, zone, name)
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		if err != nil { // such as a page still loading: asked again
			t.Logf("reading %s %s: %v", zone, name, err)
		}
		return s
	}
	shows := func(zone, name, want string) {
		t.Helper()
		deadline := time.Now().Add(within)
		for got := field(zone, name); got != want; got = field(zone, name) {
			if time.Now().After(deadline) {
				page, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
				t.Fatalf("timed out after %s waiting until the page shows %s %s = %s; it shows %q in\n%s", within, zone, name, want, got, page)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	chartPath := func(class string) string {
		js := fmt.Sprintf(`(() => { const p = document.querySelector('[data-zone="api"] svg.chart path.%s'); return p ? p.getAttribute('d') : '' })()`, class)
		d, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}

	shows("api", "held-total", "0")
	shows("api", "waiting", "0")
	shows("fleet", "store", "store redis: reachable")
	idle := chartPath("inflight")

	// The adaptive total learns from quick answers: its baseline shows.
	for range 200 {
		<-send(site + "/adaptive/")
	}
	eventually(t, within, "the adaptive total learns a baseline", func() bool { return field("backend-adaptive", "adaptive-baseline") != "0" })

	// Two requests of the evil tenant and two of tenant b fill the total;
	// three more of b wait (its limit is full), and two more are refused
	// (max_waiting 3).
	var ends []<-chan int
	for _, tenant := range []string{evilKey, evilKey, "b", "b"} {
		ends = append(ends, send(site+"/hold", "X-Tenant", tenant))
	}
	eventually(t, within, "the backend holds 4 requests", func() bool { return b.cur.Load() == 4 })
	shows("api", "held-total", "4")
	shows("api", "held-tenant", "4")
	shows("api", "keys-tenant", "2")
	for range 2 {
		ends = append(ends, send(site+"/hold", "X-Tenant", "b"))
	}
	ctx3, leave := context.WithCancel(context.Background())
	left := sendCtx(ctx3, site+"/hold", "X-Tenant", "b")
	shows("api", "waiting", "3")
	for range 2 {
		if status := <-send(site+"/hold", "X-Tenant", "c"); status != http.StatusTooManyRequests {
			t.Fatalf("a request beyond max_waiting: status %d, want 429", status)
		}
	}
	shows("api", "refused-queue_full", "2")
	eventually(t, within, "the in-flight chart rises", func() bool { return chartPath("inflight") != idle })

	// The key is text: no element came of it, no script ran.
	type escaping struct {
		Shown  bool   `json:"shown"`
		Images int    `json:"images"`
		Title  string `json:"title"`
	}
	js := fmt.Sprintf(`({shown: [...document.querySelectorAll('[data-zone="api"] td.key')].some(e => e.textContent === %q),
		images: document.querySelectorAll('img').length, title: document.title})`, evilKey)
	escaped, err := chromedp.Run(ctx, chromedp.Evaluate[escaping](js))
	if err != nil {
		t.Fatal(err)
	}
	if !escaped.Shown || escaped.Images != 0 || escaped.Title == "pwned" {
		t.Fatalf("the key %s: shown as text %v, img elements %d, title %q", evilKey, escaped.Shown, escaped.Images, escaped.Title)
	}

	// The third waiter of b leaves: b, still waiting, shows the p50 and p99
	// of its waits that ended (per_key metrics are on).
	leave()
	<-left
	shows("api", "waiting", "2")
	eventually(t, within, "the waiting key shows its wait percentiles", func() bool {
		p50, p99 := field("api", "key-p50"), field("api", "key-p99")
		return strings.HasSuffix(p50, "s") && strings.HasSuffix(p99, "s")
	})

	// A few seconds of history for the charts, then the picture.
	time.Sleep(3 * time.Second) // not a verdict: only for the screenshot's charts
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	screenshot := filepath.Join(t.TempDir(), "live-page.png")
	if *updateScreenshot {
		screenshot = "../../docs/live-page.png"
	}
	if _, err := png.Decode(bytes.NewReader(shot)); err != nil {
		t.Fatalf("the screenshot is not a PNG: %v", err)
	}
	if err := os.WriteFile(screenshot, shot, 0o644); err != nil {
		t.Fatal(err)
	}

	// Redis goes away: the next admission in its zone fails over to local
	// counts, and the page says so.
	stopRedis()
	if status := <-send(site + "/fleet/"); status != http.StatusOK {
		t.Fatalf("a request with Redis gone (on_error open): status %d, want 200", status)
	}
	shows("fleet", "store", "store redis: unreachable")

	b.open()
	for _, end := range ends {
		if status := <-end; status != http.StatusOK {
			t.Errorf("a held request ended with %d, want 200", status)
		}
	}
	shows("api", "waiting", "0")
	shows("api", "held-total", "0")
	shows("api", "keys-tenant", "0")

	// The admin endpoint serves the same page, reading /inflight/state.
	// Caddy's admin endpoint refuses a browser's request that has neither
	// Origin nor Referer (its cross-site check): the page is opened as
	// from a link on the admin endpoint, as its own requests are.
	admin := "http://" + adminAddr
	if err := chromedp.Do(ctx, headers(network.Headers{}), chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, page.Navigate, page.NavigateParams{URL: admin + "/inflight/ui", Referrer: admin + "/"})
		return err
	})); err != nil {
		t.Fatal(err)
	}
	shows("api", "refused-queue_full", "2")
	shows("api", "waits", "3") // the three that waited, now admitted
	if p50 := field("api", "p50"); p50 == "0" {
		t.Errorf("the admin page shows a wait p50 of %s after three waits of seconds", p50)
	}
}

// checkHeaders checks what a browser is told besides the page: a strict
// Content-Security-Policy, basic_auth in front of the mounted page, and 404
// for paths of the admin API that are not its own.
func checkHeaders(t *testing.T, site string) {
	t.Helper()
	get := func(url string, auth bool) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if auth {
			req.SetBasicAuth("admin", "secret")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	for _, url := range []string{"http://" + adminAddr + "/inflight/ui", site + "/inflight/"} {
		resp := get(url, true)
		csp := resp.Header.Get("Content-Security-Policy")
		if resp.StatusCode != http.StatusOK || !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "connect-src 'self'") {
			t.Errorf("GET %s: status %d, Content-Security-Policy %q; want 200 and a strict policy", url, resp.StatusCode, csp)
		}
	}
	if resp := get(site+"/inflight/", false); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the mounted page without credentials: status %d, want 401", resp.StatusCode)
	}
	for _, path := range []string{"/inflight/nope", "/inflight/ui/x", "/inflight/state/"} {
		if resp := get("http://"+adminAddr+path, false); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s on the admin endpoint: status %d, want 404", path, resp.StatusCode)
		}
	}
	for _, path := range []string{"/inflight/", "/inflight/state"} {
		resp := get("http://"+adminAddr+path, false)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("GET %s on the admin endpoint: status %d, %s; want 200 JSON", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
	if resp := get(site+"/inflight/state", false); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the mounted state without credentials: status %d, want 401", resp.StatusCode)
	}
}

// headers makes the browser send h with every request.
func headers(h network.Headers) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		if _, err := cdp.Call(ctx, t, network.Enable, network.EnableParams{}); err != nil {
			return err
		}
		_, err := cdp.Call(ctx, t, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: h})
		return err
	})
}

// freePort returns a loopback port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestLivePageChartsUnitsWithCosts: where requests have costs, the page
// charts the units in flight against the cap, which is in units, and says
// so: 3 requests of cost 500 under a total of 2000 read 1500 of 2000.
func TestLivePageChartsUnitsWithCosts(t *testing.T) {
	b := newBackend(t)
	site := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	loadWithPage(t, site, "total 2000\ncost 500\nzone costly", b.addr)
	var ends []<-chan int
	for range 3 {
		ends = append(ends, send(site+"/hold"))
	}
	eventually(t, within, "the backend holds 3 requests", func() bool { return b.cur.Load() == 3 })

	ctx := browser(t)
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1400, 1000), chromedp.Navigate(site+"/inflight/")); err != nil {
		t.Fatal(err)
	}
	const want = "units in flight (cap dashed)now 1500 · max 2000"
	caption := `(() => { const f = document.querySelector('[data-zone="costly"] figure'); return f ? f.textContent : '' })()`
	read := func() string {
		s, _ := chromedp.Run(ctx, chromedp.Evaluate[string](caption)) // an error (the page loading): asked again
		return s
	}
	deadline := time.Now().Add(within)
	got := read()
	for got != want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		got = read()
	}
	if got != want {
		t.Errorf("the in-flight chart of 3 requests of cost 500 under total 2000 reads %q, want %q", got, want)
	}
	b.open()
	for _, end := range ends {
		if status := <-end; status != http.StatusOK {
			t.Errorf("a held request ended with %d, want 200", status)
		}
	}
}

// TestLivePageShowsTokenUsage: with cost tokens, the page shows how far the
// estimates were from the usage the model reported: 2 requests estimated
// at 1,040 tokens each (61 bytes: 16, plus the default 1,024) that
// reported 130 + 390 and 130 + 1,000 read 1,650 ÷ 2,080 = 0.79, one of the
// two (50 %) over its estimate, and the output estimate (not learnt yet:
// default_output). Then 25 requests of another model, each reporting 50
// output tokens: that model's own estimate is learnt, 50, and shown beside
// it, while the zone's, from all 27 reports, is the conservative one, the
// largest, 1,000; the first model, with 2 reports, is not shown.
func TestLivePageShowsTokenUsage(t *testing.T) {
	model := serveModel(t)
	site := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	loadWithPage(t, site, "total 64000\ncost tokens {\n\tdefault_output auto\n}\nzone tokens", model)
	ask := func(name, out string) {
		body := `{"model":"` + name + `","messages":[{"role":"user","content":"hello!"}]}` // 61 bytes with model m
		req, _ := http.NewRequest("POST", site+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("X-Output", out)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	ask("m", "390")
	ask("m", "1000")
	ctx := browser(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(site+"/inflight/")); err != nil {
		t.Fatal(err)
	}
	shows := func(fields map[string]string) {
		t.Helper()
		for name, want := range fields {
			js := fmt.Sprintf(`(() => { const e = document.querySelectorAll('[data-zone="tokens"] [data-field=%q]'); return [...e].map((c) => c.textContent).join('|') })()`, name)
			var got string
			eventually(t, within, "the page shows "+name+" "+want, func() bool {
				got, _ = chromedp.Run(ctx, chromedp.Evaluate[string](js))
				return got == want
			})
		}
	}
	shows(map[string]string{
		"usage-reports": "2", "usage-ratio": "0.79", "usage-over": "50.0 %", "output-estimate": "1024 (default)", "model-name": "",
	})
	for range 25 {
		ask("small", "50")
	}
	shows(map[string]string{
		"usage-reports": "27", "output-estimate": "1000 (learned)", "model-name": "small", "model-reports": "25", "model-estimate": "50 (learned)",
	})
}

// serveModel answers chat completions as an OpenAI model would, reporting
// a prompt of 130 tokens and X-Output output tokens.
func serveModel(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":130,"completion_tokens":%s,"total_tokens":0}}`, r.Header.Get("X-Output"))
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}
