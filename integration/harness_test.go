// Package integration runs a real Caddy, in this process, with the inflight
// module in front of real backends on loopback, and checks what a user sees.
package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddy-inflight/caddy-inflight"

	"github.com/caddy-inflight/caddy-inflight/internal/incaddy"
)

// adminAddr is where every test config puts Caddy's admin API.
const adminAddr = "127.0.0.1:2999"

// globals starts every test Caddyfile: admin on a fixed loopback port, no
// automatic HTTPS, no config written to disk, logs discarded unless
// INFLIGHT_TEST_LOGS is set; extra adds global options.
func globals(extra string) string { return globalsAt(adminAddr, extra) }

// globalsAt is globals with the admin API at admin (a Caddy process of a
// test's own, beside the in-process one).
func globalsAt(admin, extra string) string {
	logs := "log {\n\t\toutput discard\n\t}"
	if os.Getenv("INFLIGHT_TEST_LOGS") != "" {
		logs = "debug"
	}
	return "{\n\tadmin " + admin + "\n\tdefault_bind 127.0.0.1\n\tauto_https off\n\tpersist_config off\n\tskip_install_trust\n\t" + logs + "\n" + extra + "\n}\n"
}

// load adapts a Caddyfile (after the test globals) and loads it into the
// in-process Caddy; a second load is a real reload.
func load(t testing.TB, caddyfile string) {
	t.Helper()
	loadWith(t, "", caddyfile)
}

// loadWith is load with extra global options.
func loadWith(t testing.TB, extraGlobals, caddyfile string) {
	t.Helper()
	if err := tryLoadWith(extraGlobals, caddyfile); err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
}

func tryLoad(caddyfile string) error { return tryLoadWith("", caddyfile) }

func tryLoadWith(extraGlobals, caddyfile string) error {
	return loadRaw(globals(extraGlobals) + caddyfile)
}

// loadRaw adapts and loads a whole Caddyfile, global options included.
func loadRaw(caddyfile string) error {
	cfg, err := adaptOnly(caddyfile)
	if err != nil {
		return err
	}
	return caddy.Load(cfg, true)
}

// adaptOnly adapts a Caddyfile to JSON.
func adaptOnly(caddyfile string) ([]byte, error) {
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	return cfg, err
}

// freePort returns a loopback port nothing listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// backend is a real HTTP server on loopback that records how many requests
// it has at once. Requests to /hold wait until the test opens the gate.
type backend struct {
	addr    string
	cur     atomic.Int64
	peak    atomic.Int64
	served  atomic.Int64
	mu      sync.Mutex
	gate    chan struct{}
	arrived []string // X-Name of each request, in arrival order
}

func newBackend(t testing.TB) *backend {
	t.Helper()
	return newBackendAt(t, "127.0.0.1:0")
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer b.cur.Add(-1)
	notePeak(&b.peak, b.cur.Add(1))
	b.mu.Lock()
	b.arrived = append(b.arrived, r.Header.Get("X-Name"))
	gate := b.gate
	b.mu.Unlock()
	defer b.served.Add(1)
	switch r.URL.Path {
	case "/hold":
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
	case "/stream": // server-sent events until the gate opens
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "data: start\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: end\n\n")
		return
	}
	io.WriteString(w, "ok")
}

// open lets every held request finish, and later ones pass at once.
func (b *backend) open() {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-b.gate:
	default:
		close(b.gate)
	}
}

// close makes later /hold requests wait again.
func (b *backend) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.gate = make(chan struct{})
}

func (b *backend) order() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.arrived...)
}

// client sends requests from a given loopback source address.
func client(srcIP string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(srcIP)}}
	return &http.Client{
		Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 100, DisableCompression: true},
		Timeout:   30 * time.Second,
	}
}

type result struct {
	status       int
	retryAfter   string
	retryAfterMs string
	body         string
	err          error
}

func get(ctx context.Context, c *http.Client, url string, header ...string) result {
	return send(ctx, c, http.MethodGet, url, "", header...)
}

// post is get with a POST of body.
func post(ctx context.Context, c *http.Client, url, body string, header ...string) result {
	return send(ctx, c, http.MethodPost, url, body, header...)
}

// send sends a request of method with body (none if empty) and the header
// fields given as name, value pairs, and reads its response whole.
func send(ctx context.Context, c *http.Client, method, url, payload string, header ...string) result {
	var r io.Reader
	if payload != "" {
		r = strings.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return result{err: err}
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" { // net/http sends req.Host, not a Host field
			req.Host = header[i+1]
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), retryAfterMs: resp.Header.Get("Retry-After-Ms"), body: string(body), err: err}
}

// getReached is get, sent again (up to 20 times) while it fails before any
// response and ctx is live: right after a reload, the old server's listening
// socket resets the connections the kernel handed it as it closed.
func getReached(ctx context.Context, c *http.Client, url string, header ...string) result {
	r := get(ctx, c, url, header...)
	for attempt := 0; r.err != nil && ctx.Err() == nil && attempt < 20; attempt++ {
		time.Sleep(20 * time.Millisecond)
		r = get(ctx, c, url, header...)
	}
	return r
}

// burst sends n requests at once and returns their results once all ended.
func burst(c *http.Client, n int, url string, header ...string) []result {
	out := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = get(context.Background(), c, url, header...)
		}()
	}
	wg.Wait()
	return out
}

func countStatus(rs []result) map[int]int {
	m := map[int]int{}
	for _, r := range rs {
		if r.err != nil {
			m[-1]++
			continue
		}
		m[r.status]++
	}
	return m
}

// eventually polls cond until it holds or twenty seconds pass. The
// deadline is no verdict on speed (tests that bound a time say so with
// their own, relative to the wait or lease they test): it only has to
// outlast a busy machine (5s did not, for a burst of 8 after a reload with
// two other suites on the cores).
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// metric returns the sum of the samples of a metric on the admin endpoint
// whose labels contain every given label pair (such as `limit="client"`).
func metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	return metricAt(t, adminAddr, name, labels...)
}

// metricAt is metric for an admin endpoint at another address.
func metricAt(t testing.TB, admin, name string, labels ...string) float64 {
	t.Helper()
	return metricIn(t, scrapeAt(t, admin), name, labels...)
}

// scrapeAt returns the metrics an admin endpoint exposes now, for reading
// several series of one instant with metricIn.
func scrapeAt(t testing.TB, admin string) string {
	t.Helper()
	resp, err := adminClient.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	return string(body)
}

// metricIn is metric, read from a scrape.
func metricIn(t testing.TB, scraped, name string, labels ...string) float64 {
	t.Helper()
	var sum float64
next:
	for _, line := range strings.Split(scraped, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue next
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

func TestMain(m *testing.M) { incaddy.Main(m) }

// newBackendAt is newBackend on a fixed loopback address, for examples that
// name their upstream.
func newBackendAt(t testing.TB, addr string) *backend {
	t.Helper()
	b := &backend{gate: make(chan struct{})}
	b.addr = serveAt(t, addr, b)
	t.Cleanup(b.open) // before the server closes: held requests end
	return b
}

// serveAt serves h on addr (port 0: any free port) until the test ends,
// and returns the address.
func serveAt(t testing.TB, addr string, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// notePeak raises peak to n if n is higher.
func notePeak(peak *atomic.Int64, n int64) {
	for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
	}
}

// hold sends one request that the backend holds, and returns once the backend
// has it; the result arrives on the channel when the gate opens.
func hold(t testing.TB, b *backend, ctx context.Context, c *http.Client, url string, header ...string) <-chan result {
	t.Helper()
	before := b.served.Load() + b.cur.Load()
	done := make(chan result, 1)
	go func() { done <- getReached(ctx, c, url, header...) }()
	eventually(t, "the backend holds the request", func() bool { return b.served.Load()+b.cur.Load() > before })
	return done
}

// adminClient talks to the admin endpoint without keep-alive, and retries
// a request that could not be sent: a load replaces the admin server, and a
// connection to the old one ends in EOF or a reset.
var adminClient = &http.Client{Transport: retrying{&http.Transport{DisableKeepAlives: true}}, Timeout: 30 * time.Second}

type retrying struct{ http.RoundTripper }

func (rt retrying) RoundTrip(req *http.Request) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		if attempt > 0 && req.GetBody != nil {
			req.Body, _ = req.GetBody()
		}
		resp, err := rt.RoundTripper.RoundTrip(req)
		if err == nil || attempt == 20 || (req.Body != nil && req.GetBody == nil) {
			return resp, err
		}
		time.Sleep(25 * time.Millisecond)
	}
}
