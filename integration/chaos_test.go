package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
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
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/goleak"
)

func init() {
	caddy.RegisterModule(new(panicker))
	httpcaddyfile.RegisterHandlerDirective("chaos_panic", func(httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		return new(panicker), nil
	})
}

// panicker is a handler that panics, as a buggy handler below inflight
// would; Caddy has no recover of its own, net/http's catches it.
type panicker struct{}

func (*panicker) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.chaos_panic", New: func() caddy.Module { return new(panicker) }}
}

func (*panicker) ServeHTTP(http.ResponseWriter, *http.Request, caddyhttp.Handler) error {
	panic("chaos: a handler below inflight panicked")
}

// chaosBackend misbehaves on purpose: slow answers, 5xx, connection resets,
// streams, WebSocket-style upgrades, and bodies read to the end.
func chaosBackend(t *testing.T) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(time.Duration(1+rand.IntN(20)) * time.Millisecond):
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("/5xx", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", http.StatusServiceUnavailable) })
	mux.HandleFunc("/reset", func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		conn.(*net.TCPConn).SetLinger(0) // RST, not FIN
		conn.Close()
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 40 {
			if _, err := fmt.Fprintf(w, "data: %d\n\n", i); err != nil {
				return
			}
			http.NewResponseController(w).Flush()
			select {
			case <-time.After(5 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
	})
	mux.HandleFunc("/body", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		rw.Flush()
		if r.URL.Query().Get("close") == "server" {
			conn.SetDeadline(time.Now().Add(20 * time.Millisecond))
		} else {
			conn.SetDeadline(time.Now().Add(5 * time.Second))
		}
		io.Copy(conn, rw) // echo until either side closes
	})
	return serveAt(t, "127.0.0.1:0", mux)
}

func chaosConfig(port int, upstream string, max int) []byte {
	caddyfile := fmt.Sprintf(`{
	admin %s
	default_bind 127.0.0.1
	auto_https off
	persist_config off
	log {
		output discard
	}
	servers {
		timeouts {
			read_body 300ms
		}
	}
}
http://127.0.0.1:%d {
	inflight {
		limit client {client_ip} %d
		total 24
		zone chaos
		wait 20ms
		max_waiting 16
		metrics per_key
	}
	route /panic {
		chaos_panic
	}
	reverse_proxy %s
}
`, adminAddr, port, max, upstream)
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		panic(err)
	}
	return cfg
}

// chaosAction is one kind of abuse; it returns what happened, for the tally.
type chaosAction func(c *http.Client, base string) string

var chaosActions = []chaosAction{
	func(c *http.Client, base string) string { return statusOf(c, base+"/ok") },
	func(c *http.Client, base string) string { return statusOf(c, base+"/slow") },
	func(c *http.Client, base string) string { return statusOf(c, base+"/5xx") },
	func(c *http.Client, base string) string { return statusOf(c, base+"/reset") },
	func(c *http.Client, base string) string { return statusOf(c, base+"/panic") },
	func(c *http.Client, base string) string { return statusOf(c, base+"/stream") },
	func(c *http.Client, base string) string { // a stream cut off by the client
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/stream", nil)
		resp, err := c.Do(req)
		if err != nil {
			return "stream-cut-early"
		}
		bufio.NewReader(resp.Body).ReadString('\n')
		cancel()
		resp.Body.Close()
		return "stream-cut"
	},
	func(c *http.Client, base string) string { // abort while waiting or in flight
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(8))*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/slow", nil)
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			return "abort-late"
		}
		return "abort"
	},
	func(c *http.Client, base string) string { // abort mid-body
		ctx, cancel := context.WithCancel(context.Background())
		pr, pw := io.Pipe()
		go func() {
			pw.Write(bytes.Repeat([]byte("x"), 1024))
			time.Sleep(2 * time.Millisecond)
			cancel()
			pw.CloseWithError(context.Canceled)
		}()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/body", pr)
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
		}
		return "abort-body"
	},
	func(c *http.Client, base string) string { // a body slower than read_body
		pr, pw := io.Pipe()
		go func() {
			defer pw.Close()
			for range 8 {
				if _, err := pw.Write([]byte("x")); err != nil {
					return
				}
				time.Sleep(60 * time.Millisecond)
			}
		}()
		req, _ := http.NewRequest(http.MethodPost, base+"/body", pr)
		resp, err := c.Do(req)
		pr.CloseWithError(io.ErrClosedPipe)
		if err != nil {
			return "read-timeout"
		}
		resp.Body.Close()
		return "slow-body-" + strconv.Itoa(resp.StatusCode)
	},
	func(c *http.Client, base string) string { return websocket(base, "client") },
	func(c *http.Client, base string) string { return websocket(base, "server") },
}

// statusOf gets url and names the outcome by path and status.
func statusOf(c *http.Client, url string) string {
	path := url[strings.LastIndexByte(url, '/')+1:]
	resp, err := c.Get(url)
	if err != nil {
		return path + "-dropped"
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return path + "-" + strconv.Itoa(resp.StatusCode)
}

// websocket upgrades a raw connection through reverse_proxy, echoes a
// message, and lets the client or the backend close it.
func websocket(base, closer string) string {
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), time.Second)
	if err != nil {
		return "ws-dial-error"
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintf(conn, "GET /ws?close=%s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", closer, conn.RemoteAddr())
	br := bufio.NewReader(conn)
	status, err := br.ReadString('\n')
	if err != nil || !strings.Contains(status, " 101 ") {
		return "ws-refused-" + strings.ReplaceAll(strings.TrimSpace(status), " ", "_")
	}
	for line, _ := br.ReadString('\n'); line != "\r\n" && line != ""; line, _ = br.ReadString('\n') {
	}
	conn.Write([]byte("ping"))
	buf := make([]byte, 4)
	io.ReadFull(br, buf)
	if closer == "server" {
		io.Copy(io.Discard, br) // until the backend hangs up
	}
	return "ws-" + closer
}

// TestChaosLeavesNothingBehind mixes every way a request can end badly with
// config reloads every 100 ms through the admin API, then checks that no
// slot, waiter, key, series or goroutine is left, and that a fresh burst of
// exactly max is admitted whole. INFLIGHT_CHAOS_REQUESTS sets the count
// (default 4000; the full run is 20000).
func TestChaosLeavesNothingBehind(t *testing.T) {
	requests := 4000
	if v, err := strconv.Atoi(os.Getenv("INFLIGHT_CHAOS_REQUESTS")); err == nil {
		requests = v
	}
	goleakBaseline := goleak.IgnoreCurrent()
	// Registered first, so it runs last: after Caddy stopped and the
	// backends closed.
	t.Cleanup(func() {
		// caddy.Stop leaves the admin endpoint up, as a fresh Caddy would.
		adminServer := goleak.IgnoreAnyFunction("github.com/caddyserver/caddy/v2.replaceLocalAdminServer.func2")
		if err := goleak.Find(goleakBaseline, adminServer); err != nil {
			t.Errorf("goroutines left behind: %v", err)
		}
	})
	upstream := chaosBackend(t)
	port := freePort(t)
	if err := caddy.Load(chaosConfig(port, upstream, 8), true); err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)

	// Reload every 100 ms, alternating the max, as an operator editing it.
	stopReloads := make(chan struct{})
	var reloads, reloadErrors atomic.Int64
	var reloadWG sync.WaitGroup
	reloadWG.Add(1)
	go func() {
		defer reloadWG.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stopReloads:
				return
			case <-tick.C:
			}
			resp, err := adminClient.Post("http://"+adminAddr+"/load", "application/json", bytes.NewReader(chaosConfig(port, upstream, 6+2*(i%2))))
			if err != nil || resp.StatusCode != 200 {
				reloadErrors.Add(1)
			} else {
				reloads.Add(1)
			}
			if resp != nil {
				resp.Body.Close()
			}
		}
	}()

	var next atomic.Int64
	var mu sync.Mutex
	tally := map[string]int{}
	var wg sync.WaitGroup
	var clients []*http.Client
	for w := range 24 {
		c := client(fmt.Sprintf("127.0.0.%d", 1+w%4))
		clients = append(clients, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(requests) {
				what := chaosActions[rand.IntN(len(chaosActions))](c, base)
				mu.Lock()
				tally[what]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(stopReloads)
	reloadWG.Wait()
	t.Logf("%d requests, %d reloads (%d failed), outcomes: %v", requests, reloads.Load(), reloadErrors.Load(), tally)
	if reloads.Load() == 0 {
		t.Fatal("no reload happened during the run")
	}

	// Nothing held, nothing waiting, no key, no per-key series.
	eventually(t, "every zone is empty", func() bool { return zonesEmpty(t) })
	if v := metric(t, "caddy_inflight_requests", `zone="chaos"`); v != 0 {
		t.Errorf("caddy_inflight_requests = %v", v)
	}
	if v := metric(t, "caddy_inflight_waiting", `zone="chaos"`); v != 0 {
		t.Errorf("caddy_inflight_waiting = %v", v)
	}
	if strings.Contains(adminGet(t, "/metrics"), "caddy_inflight_key_requests{") {
		t.Error("per-key series remain")
	}

	// A fresh burst of exactly max is admitted whole.
	b := newBackend(t)
	if err := caddy.Load(chaosConfig(port, b.addr, 8), true); err != nil {
		t.Fatal(err)
	}
	fresh := client("127.0.0.1")
	// Connections that reach the old listener during a reload are reset
	// (Caddy's handover, not this module): wait until the new one answers.
	eventually(t, "the new config answers", func() bool {
		return get(context.Background(), fresh, base+"/ok").status == 200
	})
	// The client has read the answer before the handler returns and
	// releases its slot: with that slot still held, the burst's eighth
	// request would wait 20 ms and be refused on a busy machine.
	eventually(t, "the answer's slot is released", func() bool { return zonesEmpty(t) })
	ended := make(chan result, 8) // a request of the burst that ended before the gate opened
	var burstWG sync.WaitGroup
	for range 8 {
		burstWG.Go(func() { ended <- get(context.Background(), fresh, base+"/hold") })
	}
	eventually(t, "all 8 reach the backend, or one of the burst ends", func() bool { return b.cur.Load() == 8 || len(ended) > 0 })
	if len(ended) > 0 {
		r := <-ended
		t.Errorf("fresh burst of max: a request ended with %d %v %q while %d were at the backend, want all 8 admitted; zones: %s",
			r.status, r.err, r.body, b.cur.Load(), adminGet(t, "/inflight/"))
	}
	b.open()
	burstWG.Wait()
	close(ended)
	rs := []result{}
	for r := range ended {
		rs = append(rs, r)
	}
	if countStatus(rs)[200] != len(rs) {
		t.Fatalf("fresh burst of max: %v, want 8 × 200 (%v)", countStatus(rs), rs)
	}

	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, c := range append(clients, fresh) {
		c.CloseIdleConnections()
	}
}

// ZoneLike is the part of the admin API's zone state the chaos test reads.
type ZoneLike struct {
	Zone    string
	Retired bool
	Limits  []struct {
		Held int64
		Keys int
	}
	Total   *int64
	Waiting int64
}

func (z ZoneLike) empty() bool {
	for _, l := range z.Limits {
		if l.Held != 0 || l.Keys != 0 {
			return false
		}
	}
	return z.Waiting == 0 && (z.Total == nil || *z.Total == 0)
}
