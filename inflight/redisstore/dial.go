package redisstore

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"syscall"
	"time"
)

// dialer returns go-redis's dialer, over TLS when cfg is set. A failed
// dial is handed to go-redis as a failedDial rather than as an error:
// go-redis's pool counts failed dials over the process's life and, after
// PoolSize of them, fails every dial at once with the last one's error
// until a probe dial (once a second) succeeds. After a Sentinel failover
// or a restart, calls then failed for up to a second with the dead
// master's error, each logged as a new outage and admitted locally. The
// store backs off by itself (book.available), so each call reports what
// its own dial met. Over TLS the connection is a checkedTLS.
func dialer(cfg *tls.Config, timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		d := &net.Dialer{KeepAlive: 15 * time.Second}
		var c net.Conn
		var err error
		if cfg == nil {
			c, err = d.DialContext(ctx, network, addr)
		} else {
			c, err = (&tls.Dialer{NetDialer: d, Config: cfg}).DialContext(ctx, network, addr)
			if err == nil {
				c = checkedTLS{c.(*tls.Conn)}
			}
		}
		if err != nil {
			return failedDial{addr: dialAddr{network, addr}, err: err}, nil
		}
		return c, nil
	}
}

// failedDial is a dial that failed, as a connection that fails its first
// use with the dial's error; go-redis then drops it. Its health check fails
// too, so one left idle (its caller gone) is dropped before reuse.
type failedDial struct {
	addr net.Addr
	err  error
}

func (f failedDial) Read([]byte) (int, error)         { return 0, f.wrapped() }
func (f failedDial) Write([]byte) (int, error)        { return 0, f.wrapped() }
func (f failedDial) Close() error                     { return nil }
func (f failedDial) LocalAddr() net.Addr              { return f.addr }
func (f failedDial) RemoteAddr() net.Addr             { return f.addr }
func (f failedDial) SetDeadline(time.Time) error      { return nil }
func (f failedDial) SetReadDeadline(time.Time) error  { return nil }
func (f failedDial) SetWriteDeadline(time.Time) error { return nil }
func (f failedDial) SyscallConn() (syscall.RawConn, error) {
	return nil, f.wrapped()
}

// wrapped is the dial's error in a wrapper that go-redis takes off: its
// handshake path unwraps once, which would strip "dial tcp <address>:".
func (f failedDial) wrapped() error { return fmt.Errorf("%w", f.err) }

// dialAddr is the address a failed dial was for.
type dialAddr struct{ network, addr string }

func (a dialAddr) Network() string { return a.network }
func (a dialAddr) String() string  { return a.addr }
