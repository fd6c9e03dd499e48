package redisstore

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

const secret = "s3cret-Pa55word"

// silentRedis accepts connections and never answers.
func silentRedis(t *testing.T) string {
	return fakeRedis(t, func(c net.Conn) { t.Cleanup(func() { c.Close() }) })
}

// closingRedis accepts connections and closes them at once.
func closingRedis(t *testing.T) string {
	return fakeRedis(t, func(c net.Conn) { c.Close() })
}

// fakeRedis listens on a loopback port and hands each connection to serve.
func fakeRedis(t *testing.T, serve func(net.Conn)) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			serve(c)
		}
	}()
	return l.Addr().String()
}

// The startup check (`caddy validate` and startup) does more than dial: it
// authenticates and pings with the store's own options, so a wrong or
// missing password, a Redis that never answers, or TLS against a plaintext
// Redis is reported, naming the cause.
func TestStartupCheckNamesTheCause(t *testing.T) {
	t.Setenv("INFLIGHT_TEST_UNSET_PASSWORD", "")
	protected := startRedisWith(t, "--requirepass", secret)
	plain := startRedisWith(t)
	for _, tc := range []struct {
		name  string
		store Store
		want  string
	}{
		{"wrong password", Store{Address: []string{protected}, Password: "wrong-" + secret}, "authentication failed: wrong username or password"},
		{"no password", Store{Address: []string{protected}}, "authentication failed: Redis wants a password"},
		{"empty placeholder", Store{Address: []string{protected}, Password: "{env.INFLIGHT_TEST_UNSET_PASSWORD}"},
			"authentication failed: password {env.INFLIGHT_TEST_UNSET_PASSWORD} resolved to an empty value, so none was sent: is the variable set?"},
		{"silent Redis", Store{Address: []string{silentRedis(t)}}, "timeout: no answer within 300ms"},
		{"tls against plaintext", Store{Address: []string{plain}, tlsConfig: &tls.Config{ServerName: "localhost"}}, "TLS handshake failed: Redis does not speak TLS"},
		{"nothing listens", Store{Address: []string{fmt.Sprintf("127.0.0.1:%d", freePort(t))}}, "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			s := tc.store
			s.Timeout, s.OnError, s.logger = caddy.Duration(300*time.Millisecond), "open", zap.New(core)
			s.replacePlaceholders(caddy.NewReplacer())
			s.checkAtStart()
			entries := logs.All()
			if len(entries) != 1 || entries[0].Message != unreachableAtStart {
				t.Fatalf("logged %v, want one warning %q", entries, unreachableAtStart)
			}
			if reason := entries[0].ContextMap()["reason"]; !strings.Contains(fmt.Sprint(reason), tc.want) {
				t.Fatalf("reason %q (error %v), want it to contain %q", reason, entries[0].ContextMap()["error"], tc.want)
			}
			if line := fmt.Sprint(entries[0].ContextMap()); strings.Contains(line, secret) {
				t.Fatalf("the warning shows the password: %s", line)
			}
		})
	}
	t.Run("right password", func(t *testing.T) {
		core, logs := observer.New(zap.InfoLevel)
		s := Store{Address: []string{protected}, Password: secret, Timeout: caddy.Duration(time.Second), logger: zap.New(core)}
		s.checkAtStart()
		if logs.Len() != 0 {
			t.Fatalf("logged %v with the right password, want nothing", logs.All())
		}
	})
}

// Run-time failures name their cause in the outage's log line, as the
// startup check does.
func TestOutageLogNamesTheCause(t *testing.T) {
	addr := startRedisWith(t, "--requirepass", secret)
	s := newStore(t, store(addr, func(s *Store) { s.Password = "wrong-" + secret }))
	logs := observeLogs(s.book)
	limits := &limiter.Limits{Max: []int64{5}}
	z := zoneOf(t, s, "cause", limits)
	z.Acquire(context.Background(), request(limits, "k"), limiter.WaitOptions{})
	got := logs.FilterMessage("redis store unreachable").All()
	if len(got) != 1 || !strings.Contains(fmt.Sprint(got[0].ContextMap()["reason"]), "authentication failed: wrong username or password") {
		t.Fatalf("outage log %v, want one naming the wrong password", got)
	}
}

// A dropped connection is named as seen, reset or EOF, not guessed at: in
// an outage a restart or a proxy between drops connections as well. Only
// at startup, where a Redis that drops a new connection wants TLS or is
// full, does the reason say so.
func TestCauseNamesWhatWasSeen(t *testing.T) {
	for err, want := range map[error]string{
		fmt.Errorf("read tcp 127.0.0.1:1->127.0.0.1:2: %w", syscall.ECONNRESET): "connection reset",
		io.EOF: "connection closed (EOF)",
		fmt.Errorf("dial tcp: %w", syscall.ECONNREFUSED): "connection refused: nothing listens at the address",
	} {
		if got := (failure{timeout: time.Second}).cause(err); got != want {
			t.Errorf("cause(%v) = %q, want %q", err, got, want)
		}
	}
	core, logs := observer.New(zap.InfoLevel)
	s := Store{Address: []string{closingRedis(t)}, Timeout: caddy.Duration(time.Second), OnError: "open", logger: zap.New(core)}
	s.checkAtStart()
	const want = "does Redis want TLS (tls), or is it full (maxclients)?"
	if entries := logs.All(); len(entries) != 1 || !strings.Contains(fmt.Sprint(entries[0].ContextMap()["reason"]), want) {
		t.Fatalf("startup against a Redis closing connections logged %v, want a reason asking %q", entries, want)
	}
}

// The outage log names only what is configured: a timeout of a store
// without TLS says nothing of TLS; with tls set, it says that a Redis
// without TLS does not answer either.
func TestOutageLogNamesTLSOnlyWithTLS(t *testing.T) {
	s := newStore(t, store(silentRedis(t), func(s *Store) { s.Timeout = caddy.Duration(100 * time.Millisecond) }))
	logs := observeLogs(s.book)
	limits := &limiter.Limits{Max: []int64{5}}
	z := zoneOf(t, s, "timeout", limits)
	z.Acquire(context.Background(), request(limits, "k"), limiter.WaitOptions{})
	got := logs.FilterMessage("redis store unreachable").All()
	if len(got) != 1 || got[0].ContextMap()["reason"] != "timeout: no answer within 100ms" {
		t.Fatalf("outage log %v, want one with the reason %q", got, "timeout: no answer within 100ms")
	}
	const withTLS = "timeout: no answer within 100ms (with tls, a Redis without TLS does not answer either)"
	if got := (failure{timeout: 100 * time.Millisecond, tls: true}).cause(context.DeadlineExceeded); got != withTLS {
		t.Fatalf("with tls, a timeout's reason is %q, want %q", got, withTLS)
	}
}
