package redisstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// checkAtStart tells the operator at startup (and in `caddy validate`) that
// the store cannot use Redis, with the reason: unreachable, a wrong or
// missing password, TLS on one side only, or no answer within timeout. It
// authenticates and pings with the store's own options, through a client
// of its own closed at once: the store's client is left to the requests.
// Caddy starts all the same; on_error says what requests get meanwhile.
func (s *Store) checkAtStart() {
	err := s.ping()
	if err == nil {
		return
	}
	reason := s.failure().cause(err)
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
		// At startup, not in an outage: a Redis that drops a new
		// connection at once wants TLS or is full.
		reason += ": does Redis want TLS (tls), or is it full (maxclients)?"
	}
	if s.tlsConfig != nil && s.answersPlaintext() {
		// A Redis without TLS waits for the end of a line that the
		// handshake never sends: the client sees only a timeout.
		reason = "TLS handshake failed: Redis does not speak TLS (tls is set): it answers in plaintext"
	}
	s.logger.Warn(unreachableAtStart, zap.Strings("address", s.Address), zap.String("on_error", s.OnError),
		zap.String("reason", reason), zap.Error(err))
}

// ping connects as the store would, authenticates and pings, within
// timeout.
func (s *Store) ping() error {
	opts := s.redisOptions()
	opts.PoolSize, opts.DialerRetries = 1, 1 // retries would outlast timeout, hiding the dial's error
	c := redis.NewUniversalClient(opts)
	defer c.Close()
	ctx, cancel := context.WithTimeout(storeContext, time.Duration(s.Timeout))
	defer cancel()
	return c.Ping(ctx).Err()
}

// answersPlaintext reports whether the first address answers a plaintext
// PING (with PONG, or an error such as NOAUTH).
func (s *Store) answersPlaintext() bool {
	c, err := net.DialTimeout("tcp", s.Address[0], time.Duration(s.Timeout))
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Duration(s.Timeout)))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	var first [1]byte
	_, err = c.Read(first[:])
	return err == nil && (first[0] == '+' || first[0] == '-')
}

// unreachableAtStart is the warning of a store that cannot use its Redis
// when its config is loaded.
const unreachableAtStart = "redis store unreachable at startup"

// failure is what the store's settings tell of a failed call's cause:
// the reasons name only what is configured.
type failure struct {
	timeout time.Duration
	tls     bool     // tls is set
	empty   []string // Store.emptyPasswords
}

// failure returns what its settings tell of the store's failures.
func (s *Store) failure() failure {
	return failure{timeout: time.Duration(s.Timeout), tls: s.tlsConfig != nil, empty: s.emptyPasswords}
}

// cause names, for the operator, why a Redis call failed: the raw errors
// (`ERR Protocol error: unauthenticated multibulk length`, `context deadline
// exceeded`) do not say what to fix. A dropped connection is named as it
// was seen (reset, EOF), not guessed at: in an outage, a restart or a proxy
// between drops it as well as TLS or maxclients would.
func (f failure) cause(err error) string {
	msg := err.Error()
	var recordErr tls.RecordHeaderError
	var certErr *tls.CertificateVerificationError
	var unknownAuthority x509.UnknownAuthorityError
	var hostnameErr x509.HostnameError
	var alert tls.AlertError
	var netErr net.Error
	switch {
	case strings.HasPrefix(msg, "WRONGPASS"), strings.Contains(msg, "invalid password"), strings.Contains(msg, "invalid username-password"):
		return "authentication failed: wrong username or password"
	case strings.HasPrefix(msg, "NOAUTH"), strings.Contains(msg, "unauthenticated"), strings.Contains(msg, "no password is set"):
		if len(f.empty) > 0 { // an unset variable, most likely
			return "authentication failed: " + strings.Join(f.empty, " and ") + " resolved to an empty value, so none was sent: is the variable set?"
		}
		return "authentication failed: Redis wants a password (password), or has none set for the one given"
	case errors.As(err, &recordErr):
		return "TLS handshake failed: Redis does not speak TLS (tls is set)"
	case errors.As(err, &certErr), errors.As(err, &unknownAuthority), errors.As(err, &hostnameErr), errors.As(err, &alert),
		strings.HasPrefix(msg, "tls:"):
		return "TLS handshake failed: " + msg
	case errors.Is(err, errLate), errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		if f.tls {
			return fmt.Sprintf("timeout: no answer within %s (with tls, a Redis without TLS does not answer either)", f.timeout)
		}
		return fmt.Sprintf("timeout: no answer within %s", f.timeout)
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused: nothing listens at the address"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, io.EOF):
		return "connection closed (EOF)"
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return "no such host: " + dnsErr.Name
	}
	return msg
}
