// Package browser drives the live page in a real Chromium (chromedp) while a
// real Caddy, in this process, serves it under live traffic. A nested module,
// so that the plugin's go.mod gains no dependency.
package browser

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/chromedp/chromedp"

	_ "github.com/caddy-inflight/caddy-inflight"
	"github.com/caddy-inflight/caddy-inflight/internal/incaddy"
)

// adminAddr is where the test config puts Caddy's admin API, as in
// ../harness_test.go: run the tests in a network namespace of their own.
const adminAddr = "127.0.0.1:2999"

// load runs a Caddyfile, after the test globals, until the test ends.
func load(t *testing.T, caddyfile string) { incaddy.Load(t, incaddy.Globals(adminAddr, "")+caddyfile) }

// loadWithPage runs a site that serves the live page at /inflight/ and
// sends the rest through inflight, with options (one a line), to upstream.
func loadWithPage(t *testing.T, site, options, upstream string) {
	indented := "\t\t\t" + strings.ReplaceAll(options, "\n", "\n\t\t\t")
	load(t, site+" {\n\thandle /inflight/* {\n\t\tinflight_ui\n\t}\n\thandle {\n\t\tinflight {\n"+indented+"\n\t\t}\n\t\treverse_proxy "+upstream+"\n\t}\n}\n")
}

// backend counts the requests it holds; /hold waits until the gate opens.
type backend struct {
	addr string
	cur  atomic.Int64
	mu   sync.Mutex
	gate chan struct{}
}

func newBackend(t *testing.T) *backend {
	t.Helper()
	b := &backend{gate: make(chan struct{})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: b}
	go srv.Serve(l)
	b.addr = l.Addr().String()
	t.Cleanup(func() { srv.Close() })
	t.Cleanup(b.open) // runs first: held requests end before the server closes
	return b
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.cur.Add(1)
	defer b.cur.Add(-1)
	b.mu.Lock()
	gate := b.gate
	b.mu.Unlock()
	if r.URL.Path == "/hold" {
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
	}
	io.WriteString(w, "ok")
}

// open lets every held request finish.
func (b *backend) open() {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-b.gate:
	default:
		close(b.gate)
	}
}

// send starts a request and returns its status on the channel when it ends
// (-1 if it failed).
func send(url string, header ...string) <-chan int {
	return sendCtx(context.Background(), url, header...)
}

// sendCtx is send with a context, whose end makes the client leave.
func sendCtx(ctx context.Context, url string, header ...string) <-chan int {
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- -1
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	return done
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startRedis starts a redis-server on a free loopback port, and returns its
// address and a func that stops it (also called when the test ends).
func startRedis(t *testing.T) (string, func()) {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server is not installed (.ci/run installs it)")
		}
		t.Skip("redis-server is not installed: apt-get install -y redis-server")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	l.Close()
	cmd := exec.Command(path, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() { once.Do(func() { cmd.Process.Kill(); cmd.Wait() }) }
	t.Cleanup(stop)
	eventually(t, within, "redis-server listens", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr, stop
}

// browser starts a headless Chromium with a fresh profile; its context ends
// with the test.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("chromium is not installed (.ci/run installs it: apt-get install -y chromium)")
		}
		t.Skip("chromium is not installed: apt-get install -y chromium")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "inflight-browser")
	if err != nil {
		panic(err)
	}
	os.Setenv("XDG_DATA_HOME", dir)
	os.Setenv("XDG_CONFIG_HOME", dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
