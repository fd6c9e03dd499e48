package layer4

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
)

// slot is what one admitted connection holds, given back once however many
// of its ends are seen (its close, its handler returning, a reset).
type slot struct {
	gate     *core.Gate
	ticket   core.Ticket
	released atomic.Bool
}

func (s *slot) release() {
	if !s.released.Swap(true) {
		s.gate.Release(&s.ticket)
	}
}

// releasingConn gives its connection's slot back when the connection is
// over, however that is seen: closed by whoever closes it (the handler
// chain's end does not always close it: the layer4 listener wrapper hands
// it to the HTTP server, which closes it later), reset, or done in both
// directions. A client's half-close is not the end: a client that has sent
// its request and shut its write side is still reading the answer.
type releasingConn struct {
	net.Conn
	slot *slot
	// readDone and writeDone are the two half-closes: the client's (its
	// EOF read) and the server's (CloseWrite).
	readDone, writeDone atomic.Bool
}

// Read gives the slot back when the connection has failed (reset, or
// closed under the reader), or when the client's EOF follows the server's
// half-close. A deadline's timeout is no end.
func (c *releasingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	switch {
	case err == nil || errors.Is(err, os.ErrDeadlineExceeded):
	case errors.Is(err, io.EOF):
		c.readDone.Store(true)
		if c.writeDone.Load() {
			c.slot.release()
		}
	default:
		c.slot.release()
	}
	return n, err
}

func (c *releasingConn) Close() error {
	err := c.Conn.Close()
	c.slot.release()
	return err
}

// CloseWrite half-closes the connection where it can be, as the proxy
// handler does when the upstream has finished sending; after the client's
// EOF, that ends the connection.
func (c *releasingConn) CloseWrite() error {
	cw, ok := c.Conn.(interface{ CloseWrite() error })
	if !ok {
		return errNoCloseWrite
	}
	err := cw.CloseWrite()
	c.writeDone.Store(true)
	if c.readDone.Load() {
		c.slot.release()
	}
	return err
}

// ended reports whether the connection was read to its end or is over.
func (c *releasingConn) ended() bool {
	return c.readDone.Load() || c.slot.released.Load()
}
