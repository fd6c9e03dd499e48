package layer4

import (
	"errors"
	"net"
	"os"

	"github.com/caddy-inflight/caddy-inflight/inflight"
)

// releasingConn gives its connection's slots back when it is closed, by
// whoever closes it: the handler chain's end does not always close it (the
// layer4 listener wrapper hands it to the HTTP server, which closes it
// later).
type releasingConn struct {
	net.Conn
	ticket *inflight.Ticket
}

// Read gives the slots back when the connection has ended: the client
// closed or reset it. A deadline's timeout is no end.
func (c *releasingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		c.ticket.Release()
	}
	return n, err
}

func (c *releasingConn) Close() error {
	err := c.Conn.Close()
	c.ticket.Release()
	return err
}

// CloseWrite half-closes the connection where it can be, as the proxy
// handler does when the client has finished sending.
func (c *releasingConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errNoCloseWrite
}
