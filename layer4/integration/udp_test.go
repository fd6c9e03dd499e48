package integration

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"
)

// TestUDPSessions: caddy-l4 models a UDP session per remote address and
// port, ended by its idle timeout; `inflight 1` holds a slot per session,
// closes a second session of the same client address, and gives the slot
// back when the first session times out.
func TestUDPSessions(t *testing.T) {
	at := addr(t) // a free TCP port; its UDP twin is free in this namespace
	listen := "udp/" + at
	c := startCaddy(t, "\tlayer4 {\n\t\t"+listen+" {\n\t\t\tidle_timeout 1s\n\t\t\troute {\n\t\t\t\tinflight 1\n\t\t\t\techo\n\t\t\t}\n\t\t}\n\t}\n", "")
	zone := zoneOf(listen)
	eventually(t, "the zone is provisioned", func() bool {
		for _, z := range c.zones(t) {
			if z.Zone == zone {
				return true
			}
		}
		return false
	})
	udp := func() *net.UDPConn {
		conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(mustAddrPort(t, at)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	// ping sends until it gets the echo (a datagram may be lost before the
	// listener is up), or reports false after 2s of silence.
	ping := func(conn *net.UDPConn, tries int) bool {
		buf := make([]byte, 16)
		for range tries {
			conn.Write([]byte("ping"))
			conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			n, err := conn.Read(buf)
			if err == nil {
				return string(buf[:n]) == "ping"
			}
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				return false
			}
		}
		return false
	}
	first := udp()
	if !ping(first, 150) {
		t.Fatal("the first session got no echo")
	}
	second := udp()
	second.Write([]byte("ping"))
	eventually(t, "the second session is refused", func() bool { return c.zone(t, zone).Refused["full"] >= 1 })
	if held := c.held(t, zone); held != 1 {
		t.Fatalf("held %d with one session open, want 1", held)
	}
	eventually(t, "the first session ends at its idle timeout", func() bool { return c.held(t, zone) == 0 })
	if !ping(second, 150) {
		t.Fatal("the second client's new session got no echo once the first ended")
	}
	t.Logf("second session of one address refused while the first was open; admitted after the first's 1s idle timeout")
}

func mustAddrPort(t testing.TB, s string) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		t.Fatal(err)
	}
	return ap
}
