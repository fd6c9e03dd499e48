package redisstore

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/caddy-inflight/caddy-inflight/inflight/fleet"
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// startRedis starts a redis-server of its own on a free loopback port. It
// returns the address and a client for inspecting what the store wrote.
func startRedis(t testing.TB) (string, *redis.Client) {
	t.Helper()
	addr := startRedisWith(t)
	cli := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { cli.Close() })
	eventually(t, "redis answers", func() bool { return cli.Ping(context.Background()).Err() == nil })
	return addr, cli
}

// startRedisWith starts a redis-server of its own with extra arguments and
// returns its address. The tests check Redis itself (its Lua, its TIME,
// its INFO), not a stand-in: without redis-server a test fails in CI (CI
// set, as .ci/run installs it) and is skipped elsewhere, saying so.
func startRedisWith(t testing.TB, args ...string) string {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server is not installed: apt-get install redis-server (.ci/run installs it)")
		}
		t.Skip("redis-server is not installed (apt-get install redis-server): skipped here, a failure in CI")
	}
	port := freePort(t)
	cmd := exec.Command(path, append([]string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	eventually(t, "redis listens", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// eventually polls cond until it holds, failing the test after 10 s: a
// bound against hanging, not a measure of speed.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 10s", what)
		}
	}
}

// newStore provisions a redis store as Caddy would, cleaned up with the
// test unless the test does it itself.
func newStore(t testing.TB, s *Store) *Store {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := s.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b := s.book
		s.Cleanup()
		if b == nil {
			return
		}
		// The book closes once its zones' last calls are over: a later
		// test with the same options (a port used again) gets a new one.
		eventually(t, "the book closed", func() bool {
			books.Lock()
			defer books.Unlock()
			return books.m[b.id] != b
		})
	})
	return s
}

// zoneOf returns a zone of the store, named name, under limits (one
// limit "client" and optionally a total), admitting within the
// allowances of the store's ledger; it and its ledger are closed when t
// ends.
func zoneOf(t testing.TB, s *Store, name string, limits *limiter.Limits) *limiter.Zone {
	z := limiter.NewZone(len(limits.Max), limits.Total > 0, nil)
	l := &watched{ledger: s.Ledger(name).(*ledger)}
	calls.Store(z, l)
	z.SetLedger(l)
	z.Adopt(limits)
	t.Cleanup(func() {
		z.Close()
		l.Close() // as the zone's config does once it is gone
		calls.Delete(z)
	})
	return z
}

// watched is a ledger whose calls under way are counted, so that a test
// can wait for a zone's asker to be idle (see callsUnderWay).
type watched struct {
	*ledger
	under atomic.Int32
}

func (w *watched) Ask(c *fleet.Call) error {
	w.under.Add(1)
	defer w.under.Add(-1)
	return w.ledger.Ask(c)
}

// calls holds the watched ledger of each zone of zoneOf.
var calls sync.Map

// callsUnderWay returns how many calls z's ledger is making.
func callsUnderWay(z *limiter.Zone) int32 {
	w, _ := calls.Load(z)
	return w.(*watched).under.Load()
}

func request(limits *limiter.Limits, key string) *limiter.Request {
	return &limiter.Request{Keys: []string{key}, Max: []int64{0}, Limits: limits}
}

// allowances sums the units of the allowances Redis holds under the
// store's prefix.
func allowances(t testing.TB, cli *redis.Client, prefix string) int64 {
	t.Helper()
	ctx := context.Background()
	keys, err := cli.Keys(ctx, prefix+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, k := range keys {
		if typ, _ := cli.Type(ctx, k).Result(); typ != "hash" {
			continue
		}
		for f, v := range cli.HGetAll(ctx, k).Val() {
			if strings.HasPrefix(f, "~") {
				continue
			}
			units, _, _ := strings.Cut(v, " ")
			u, _ := strconv.ParseInt(units, 10, 64)
			n += u
		}
	}
	return n
}

// faultProxy forwards TCP to Redis and can hold back Redis's replies
// (stall), delay them, hold back requests, or refuse connections.
type faultProxy struct {
	addr     string
	target   string
	mu       sync.Mutex
	delay    time.Duration
	stall    chan struct{} // non-nil: replies wait until it is closed
	holdReqs chan struct{} // non-nil: requests read now wait until it is closed
	held     int           // reads that waited on holdReqs
	refuse   bool
	conns    []net.Conn
}

func newFaultProxy(t testing.TB, target string) *faultProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{addr: l.Addr().String(), target: target}
	t.Cleanup(func() { l.Close(); p.setStall(false); p.dropAll() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *faultProxy) serve(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.refuse { // checked with the connection list, so setDown misses none
		p.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	p.conns = append(p.conns, c, up)
	p.mu.Unlock()
	go p.forwardRequests(c, up)
	buf := make([]byte, 64<<10)
	for {
		n, err := up.Read(buf)
		if n > 0 {
			p.mu.Lock()
			delay, stall := p.delay, p.stall
			p.mu.Unlock()
			if stall != nil {
				<-stall
			}
			time.Sleep(delay)
			if _, werr := c.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	c.Close()
}

// forwardRequests copies the client's requests to Redis. Those read while
// requests are held wait, even after the client has gone: bytes late in
// the network.
func (p *faultProxy) forwardRequests(c, up net.Conn) {
	defer up.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			p.mu.Lock()
			hold := p.holdReqs
			if hold != nil {
				p.held++
			}
			p.mu.Unlock()
			if hold != nil {
				<-hold
			}
			if _, werr := up.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// holdRequests holds back the requests sent from now on. After stop, new
// requests pass again, while those held wait for flush. Stop first waits
// until a request is held: under load the proxy may read one that was
// sent before stop only after it, and would let it pass.
func (p *faultProxy) holdRequests(t testing.TB) (stop, flush func()) {
	hold := make(chan struct{})
	p.mu.Lock()
	p.holdReqs, p.held = hold, 0
	p.mu.Unlock()
	stop = func() {
		t.Helper()
		eventually(t, "a request held in the network", func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			return p.held > 0
		})
		p.mu.Lock()
		p.holdReqs = nil
		p.mu.Unlock()
	}
	return stop, func() { close(hold) }
}

func (p *faultProxy) setDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// setStall holds back every reply from now on, or lets them go.
func (p *faultProxy) setStall(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && p.stall == nil:
		p.stall = make(chan struct{})
	case !on && p.stall != nil:
		close(p.stall)
		p.stall = nil
	}
}

// setDown refuses new connections and drops the open ones, or accepts
// them again.
func (p *faultProxy) setDown(down bool) {
	p.mu.Lock()
	p.refuse = down
	p.mu.Unlock()
	if down {
		p.dropAll()
	}
}

func (p *faultProxy) dropAll() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// commandStat is one line of INFO commandstats.
type commandStat struct {
	calls int64
	usec  float64
}

// commandStats returns Redis's INFO commandstats by command (lower case).
func commandStats(t testing.TB, cli *redis.Client) map[string]commandStat {
	t.Helper()
	info, err := cli.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	stats := map[string]commandStat{}
	for _, line := range strings.Split(info, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st commandStat
		for _, f := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				st.calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				st.usec, _ = strconv.ParseFloat(v, 64)
			}
		}
		stats[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return stats
}
