package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a redis-server process of the test's own, on loopback.
type redisServer struct {
	addr string
	port int
	args []string // extra arguments, such as --cluster-enabled yes
	cmd  *exec.Cmd
}

// startRedis runs a fresh redis-server (from Debian's package, which
// .ci/run installs). Without one, the test is skipped, except in CI, where
// it fails.
func startRedis(t testing.TB) *redisServer {
	t.Helper()
	return startRedisWith(t, freePort(t))
}

// startRedisWith is startRedis on a given port, with extra arguments.
func startRedisWith(t testing.TB, port int, args ...string) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server is not installed; .ci/run installs it")
		}
		t.Skip("redis-server is not installed (apt-get install redis-server)")
	}
	r := &redisServer{port: port, args: args}
	r.addr = fmt.Sprintf("127.0.0.1:%d", r.port)
	r.start(t)
	t.Cleanup(r.stop)
	return r
}

func (r *redisServer) start(t testing.TB) {
	t.Helper()
	r.cmd = exec.Command("redis-server", "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir())
	r.cmd.Args = append(r.cmd.Args, r.args...)
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitForPort(t, r.addr)
}

func (r *redisServer) stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		r.cmd.Process.Kill()
		r.cmd.Wait()
	}
	r.cmd = nil
}

// waitForPort waits until something accepts connections on addr.
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

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// caddyBinary builds examples/caddy (Caddy with the module) once per run,
// or returns INFLIGHT_CADDY, a Caddy with the module built already (CI
// passes the one xcaddy built, saving a second build).
func caddyBinary(t *testing.T) string {
	t.Helper()
	if prebuilt := os.Getenv("INFLIGHT_CADDY"); prebuilt != "" {
		return prebuilt
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "inflight-caddy")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "caddy")
		out, err := exec.Command("go", "build", "-o", binary, "../examples/caddy").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// caddyProcess is Caddy running in a process of its own, as one instance
// of a fleet.
type caddyProcess struct {
	cmd *exec.Cmd
}

// startCaddy runs the Caddyfile in a new Caddy process and waits until it
// listens on port.
func startCaddy(t *testing.T, caddyfile string, port int) *caddyProcess {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(cfg, []byte(caddyfile), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(caddyBinary(t), "run", "--config", cfg, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	stderr, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &caddyProcess{cmd: cmd}
	t.Cleanup(func() {
		p.kill()
		stderr.Close()
		crashed(t, stderr.Name())
	})
	waitForPort(t, fmt.Sprintf("127.0.0.1:%d", port))
	return p
}

// crashed fails t if the Caddy process whose standard error is in path
// panicked or met a data race, with what it printed.
func crashed(t *testing.T, path string) {
	data, _ := os.ReadFile(path)
	for _, sign := range []string{"panic:", "WARNING: DATA RACE", "fatal error:"} {
		if i := strings.Index(string(data), sign); i >= 0 {
			t.Errorf("a Caddy process crashed:\n%s", data[i:min(len(data), i+4000)])
			return
		}
	}
}

// kill stops the process at once (SIGKILL): no cleanup, no release.
func (p *caddyProcess) kill() {
	if p.cmd.ProcessState == nil {
		p.cmd.Process.Signal(syscall.SIGKILL)
		p.cmd.Wait()
	}
}

// The fleet's ledger in Redis (redisstore's layout a1): a hash per set, a
// field per instance holding "<units> <spare> <expiry> <version>", and
// "~r:<instance>" per instance that reports waiters there.

// fleetFields calls fn with every field and value of the ledger's hashes
// under prefix ("" for all).
func fleetFields(t testing.TB, rc *redis.Client, prefix string, fn func(field, value string)) {
	t.Helper()
	ctx := context.Background()
	pattern := "*"
	if prefix != "" {
		pattern = prefix + ":*"
	}
	keys, err := rc.Keys(ctx, pattern).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if rc.Type(ctx, k).Val() != "hash" {
			continue
		}
		for f, v := range rc.HGetAll(ctx, k).Val() {
			fn(f, v)
		}
	}
}

// fleetUnits sums the units of the allowances Redis holds under prefix.
func fleetUnits(t testing.TB, rc *redis.Client, prefix string) int64 {
	var n int64
	fleetFields(t, rc, prefix, func(f, v string) {
		if !strings.HasPrefix(f, "~") {
			units, _, _ := strings.Cut(v, " ")
			u, _ := strconv.ParseInt(units, 10, 64)
			n += u
		}
	})
	return n
}

// fleetReports counts the reports of waiters Redis holds.
func fleetReports(rc *redis.Client) int {
	n := 0
	ctx := context.Background()
	for _, k := range rc.Keys(ctx, "*").Val() {
		if rc.Type(ctx, k).Val() != "hash" {
			continue
		}
		for f := range rc.HGetAll(ctx, k).Val() {
			if strings.HasPrefix(f, "~r:") {
				n++
			}
		}
	}
	return n
}

// allowanceExpiry returns the latest expiry (Redis ms) of the allowances
// in Redis.
func allowanceExpiry(t testing.TB, rc *redis.Client) int64 {
	var latest int64
	fleetFields(t, rc, "", func(f, v string) {
		if p := strings.Fields(v); !strings.HasPrefix(f, "~") && len(p) == 4 {
			e, _ := strconv.ParseInt(p[2], 10, 64)
			latest = max(latest, e)
		}
	})
	return latest
}
