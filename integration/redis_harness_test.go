package integration

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
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
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &caddyProcess{cmd: cmd}
	t.Cleanup(p.kill)
	waitForPort(t, fmt.Sprintf("127.0.0.1:%d", port))
	return p
}

// kill stops the process at once (SIGKILL): no cleanup, no release.
func (p *caddyProcess) kill() {
	if p.cmd.ProcessState == nil {
		p.cmd.Process.Signal(syscall.SIGKILL)
		p.cmd.Wait()
	}
}
