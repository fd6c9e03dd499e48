package redisstore

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// go-redis's lines ("redis: 2026/11/30 ... pool.go:770: ...") go through
// Caddy's logger, named redis, not as plain text to stderr into Caddy's
// JSON log.
func TestGoRedisLogsThroughCaddysLogger(t *testing.T) {
	stderr := captureStderr(t)
	// A sentinel that does not listen: go-redis logs the failed lookup of
	// the master (a failed dial is the caller's error, see dialer).
	s := newStore(t, store(fmt.Sprintf("127.0.0.1:%d", freePort(t)), func(s *Store) {
		s.MasterName = "log"
		s.Timeout = caddy.Duration(100 * time.Millisecond)
	}))
	limits := &limiter.Limits{Max: []int64{5}}
	z := zoneOf(t, s, "log", limits)
	z.Acquire(context.Background(), request(limits, "k"), limiter.WaitOptions{})
	const line = "GetMasterAddrByName"
	eventually(t, "go-redis logs the failed lookup", func() bool { return strings.Contains(stderr(), line) })
	for _, l := range strings.Split(stderr(), "\n") {
		if strings.Contains(l, line) && !strings.Contains(l, `"logger":"redis"`) {
			t.Fatalf("go-redis line not through Caddy's logger named redis:\n%s", l)
		}
	}
}

// captureStderr sends file descriptor 2 to a pipe for the rest of the
// test; the returned function reads what was written so far.
func captureStderr(t *testing.T) func() string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved, err := syscall.Dup(2)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Dup2(int(w.Fd()), 2); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var buf bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		chunk := make([]byte, 4096)
		for {
			n, err := r.Read(chunk)
			mu.Lock()
			buf.Write(chunk[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		syscall.Dup2(saved, 2)
		syscall.Close(saved)
		w.Close()
		<-done
	})
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return buf.String()
	}
}

// recordedLogging is another plugin's go-redis logger.
type recordedLogging struct {
	mu    sync.Mutex
	lines []string
}

func (r *recordedLogging) Printf(_ context.Context, format string, v ...any) {
	r.mu.Lock()
	r.lines = append(r.lines, fmt.Sprintf(format, v...))
	r.mu.Unlock()
}

func (r *recordedLogging) has(text string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.lines, func(l string) bool { return strings.Contains(l, text) })
}

// Provisioning the store keeps a go-redis process-wide logger that another
// plugin set: that plugin's go-redis lines go where it sends them, not to
// Caddy's log.
func TestAnotherPluginsGoRedisLoggerIsKept(t *testing.T) {
	theirs := new(recordedLogging)
	redis.SetLogger(theirs)
	t.Cleanup(func() { redis.SetLogger(routedLogging{}) })
	newStore(t, store(fmt.Sprintf("127.0.0.1:%d", freePort(t)), func(s *Store) { s.Timeout = caddy.Duration(100 * time.Millisecond) }))
	other := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", freePort(t)), DialerRetries: 1})
	defer other.Close()
	other.Ping(context.Background()) // nothing listens: go-redis logs the failed dial
	if !theirs.has("failed to dial") {
		t.Fatal("another plugin's go-redis logger did not get its client's line: the store replaced it")
	}
}

// Lines of go-redis clients other than the store's are
// written as go-redis writes them, not in Caddy's log under the store's
// name.
func TestOtherClientsGoRedisLinesStayTheirs(t *testing.T) {
	stderr := captureStderr(t)
	// An address no store of an earlier test had: their lines go to
	// Caddy's log, as the store's.
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	for ownLine(nil, "dial tcp "+addr+": connect") {
		addr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	}
	other := redis.NewClient(&redis.Options{Addr: addr, DialerRetries: 1})
	defer other.Close()
	other.Ping(context.Background())
	eventually(t, "go-redis logs the failed dial", func() bool { return strings.Contains(stderr(), "failed to dial") })
	// Only this client's lines: a store of an earlier test may still be
	// logging through Caddy's logger while it winds down.
	for _, l := range strings.Split(stderr(), "\n") {
		if strings.Contains(l, addr) && strings.Contains(l, `"logger":"redis"`) {
			t.Fatalf("another client's go-redis line went to Caddy's log:\n%s", l)
		}
	}
}

// A line about another address is not the store's, even where the
// store's address is part of it: an address it begins (port 4559 in
// 127.9.9.9:45595) or ends (10.0.0.1:80 in 110.0.0.1:80, redis:6379 in
// myredis:6379).
func TestLinesOfAnotherAddressStayTheirs(t *testing.T) {
	for _, store := range []string{"127.9.9.9:4559", "10.0.0.1:80", "redis:6379"} {
		storeAddresses.Store(store, true)
		defer storeAddresses.Delete(store)
	}
	for line, own := range map[string]bool{
		"dial tcp 127.9.9.9:4559: connect: connection refused":  true,
		"dial tcp 127.9.9.9:4559":                               true,
		"dial tcp 127.9.9.9:45595: connect: connection refused": false,
		"127.9.9.9:45595 and 127.9.9.9:4559 both":               true,
		"dial tcp 10.0.0.1:80: i/o timeout":                     true,
		"10.0.0.1:80: i/o timeout":                              true,
		"dial tcp 110.0.0.1:80: i/o timeout":                    false,
		"dial tcp myredis:6379: no such host":                   false,
		"dial tcp redis-redis:6379: no such host":               false,
		"dial tcp sentinel.redis:6379: no such host":            false,
		"dial tcp redis:6379: no such host":                     true,
		"addr=redis:6379 failed":                                true,
		"myredis:6379 and redis:6379 both":                      true,
	} {
		if got := ownLine(nil, line); got != own {
			t.Errorf("%q: the store's line: %v, want %v", line, got, own)
		}
	}
}
