// Package integration runs a Caddy built with caddy-l4 and the inflight
// modules (../caddy, or INFLIGHT_CADDY_L4) in processes of its own, on
// loopback. Run it in a network namespace of its own, as the repository's
// integration tests:
//
//	unshare -n sh -c 'ip link set lo up && go test -race -count=1 ./integration'
package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// caddyBinary builds ../caddy once per run, or returns INFLIGHT_CADDY_L4, a
// Caddy built with caddy-l4 and this module already (CI passes the one
// xcaddy built).
func caddyBinary(t testing.TB) string {
	t.Helper()
	if prebuilt := os.Getenv("INFLIGHT_CADDY_L4"); prebuilt != "" {
		return prebuilt
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "inflight-l4-caddy")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "caddy")
		out, err := exec.Command("go", "build", "-o", binary, "../caddy").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// caddy is a Caddy process with an admin endpoint of its own.
type caddy struct {
	admin string
	cmd   *exec.Cmd
	log   *syncBuffer
	dir   string
}

// startCaddy runs the Caddyfile, whose global options are preceded by
// `admin <addr>`: config is the rest of the global block and the sites,
// without the block's braces; it waits until every port in wait accepts.
func startCaddy(t testing.TB, globals, sites string, wait ...string) *caddy {
	t.Helper()
	c := &caddy{admin: "127.0.0.1:" + strconv.Itoa(freePort(t)), log: new(syncBuffer), dir: t.TempDir()}
	cfg := filepath.Join(c.dir, "Caddyfile")
	if err := os.WriteFile(cfg, []byte(c.caddyfile(globals, sites)), 0o644); err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command(caddyBinary(t), "run", "--config", cfg, "--adapter", "caddyfile")
	c.cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+c.dir, "XDG_CONFIG_HOME="+c.dir)
	c.cmd.Stdout, c.cmd.Stderr = c.log, c.log
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.cmd.Process.Signal(syscall.SIGKILL)
		c.cmd.Wait()
		if t.Failed() {
			t.Logf("caddy log:\n%s", c.log.String())
		}
	})
	waitForPort(t, c.admin)
	// Not by dialing: a dial would go through the handlers, and hold a
	// slot until the instance sees it closed, which may be after the
	// test's first connection.
	for _, addr := range wait {
		waitForListener(t, addr)
	}
	return c
}

func (c *caddy) caddyfile(globals, sites string) string {
	return "{\n\tadmin " + c.admin + "\n" + globals + "}\n" + sites
}

// reload loads a new Caddyfile through the admin API, as `caddy reload`.
func (c *caddy) reload(t testing.TB, globals, sites string) {
	t.Helper()
	resp, err := http.Post("http://"+c.admin+"/load", "text/caddyfile", strings.NewReader(c.caddyfile(globals, sites)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if body, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK {
		t.Fatalf("reload: %s: %s", resp.Status, body)
	}
}

// zoneState is a zone as GET /inflight/ shows it.
type zoneState struct {
	Zone   string `json:"zone"`
	Limits []struct {
		Name string `json:"name"`
		Held int64  `json:"held"`
		Keys int    `json:"keys"`
	} `json:"limits"`
	Waiting      int64            `json:"waiting"`
	WaitingUnits int64            `json:"waiting_units"`
	Refused      map[string]int64 `json:"refused"`
	TopKeys      []any            `json:"top_keys"`
	Retired      bool             `json:"retired"`
}

// zone returns the admin API's state of a zone.
func (c *caddy) zone(t testing.TB, name string) zoneState {
	t.Helper()
	zones := c.zones(t)
	for _, z := range zones {
		if z.Zone == name && !z.Retired {
			return z
		}
	}
	t.Fatalf("zone %q is not in the admin API: %+v", name, zones)
	return zoneState{}
}

// zones returns every zone of the admin API.
func (c *caddy) zones(t testing.TB) []zoneState {
	t.Helper()
	resp, err := http.Get("http://" + c.admin + "/inflight/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct{ Zones []zoneState }
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st.Zones
}

// held returns the slots held in a zone's first limit.
func (c *caddy) held(t testing.TB, zone string) int64 {
	t.Helper()
	return c.zone(t, zone).Limits[0].Held
}

// metric returns the value of a metric series from the admin endpoint's
// /metrics, 0 if absent; labels are name="value" pairs it must carry.
func (c *caddy) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + c.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	sum := 0.0
lines:
	for _, l := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		for _, lb := range labels {
			if !strings.Contains(l, lb) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", l, err)
		}
		sum += v
	}
	return sum
}

// eventually waits for cond, generously: verdicts never depend on timing.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still not the case after 30s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitForPort(t testing.TB, addr string) {
	t.Helper()
	eventually(t, addr+" accepts connections", func() bool {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// waitForListener waits until a TCP socket listens on addr's port, as
// the kernel lists them (/proc/net/tcp and tcp6), without connecting.
func waitForListener(t testing.TB, addr string) {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	local := fmt.Sprintf(":%04X", n)
	eventually(t, addr+" listens", func() bool {
		for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			b, _ := os.ReadFile(table)
			for _, line := range strings.Split(string(b), "\n")[1:] {
				f := strings.Fields(line)
				if len(f) > 3 && strings.HasSuffix(f[1], local) && f[3] == "0A" { // LISTEN
					return true
				}
			}
		}
		return false
	})
}

// freePort returns a loopback port free now for Caddy to listen on, from
// below the kernel's ephemeral range (32768 up on Linux): a port the
// kernel hands out for a listener on :0 or for a client's connection is
// never one Caddy is about to take (Caddy listens with SO_REUSEPORT, so
// another listener on its port would share its connections). Each port
// is handed out once per process, from a place its process ID sets.
func freePort(t testing.TB) int {
	t.Helper()
	for range portSpan {
		port := portLow + int((uint64(os.Getpid())*7919+nextPort.Add(1))%portSpan)
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
			l.Close()
			return port
		}
	}
	t.Fatal("no free port below the ephemeral range")
	return 0
}

// The ports freePort hands out: portLow to portLow+portSpan-1.
const portLow, portSpan = 20000, 12000

var nextPort atomic.Uint64

func addr(t testing.TB) string { return "127.0.0.1:" + strconv.Itoa(freePort(t)) }

// dial connects to addr from the loopback address from (127.0.0.x).
func dial(t testing.TB, addr, from string) *net.TCPConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// echoed reports whether the connection echoes what it is sent (admitted
// through an echo route) rather than being closed (refused); it waits as
// long as it takes.
func echoed(t testing.TB, c net.Conn) bool {
	t.Helper()
	if _, err := c.Write([]byte("ping")); err != nil {
		return false
	}
	return readEcho(t, c, 30*time.Second)
}

// readEcho reads the echo of "ping" within d; false when the connection is
// closed instead.
func readEcho(t testing.TB, c net.Conn, d time.Duration) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, 4)
	_, err := io.ReadFull(c, buf)
	switch {
	case err == nil:
		return string(buf) == "ping"
	case errors.Is(err, os.ErrDeadlineExceeded):
		t.Fatalf("neither echoed nor closed within %s", d)
	}
	return false // closed: EOF or reset
}

// syncBuffer collects a process's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
