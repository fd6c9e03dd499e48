package integration

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestListenerWrapper: caddy.listeners.layer4 in front of the HTTP app
// with `inflight 2`. Its handler chain returns as soon as it hands a
// connection to the HTTP server, which keeps it alive for more requests:
// the slots stay held until the HTTP server closes the connection.
func TestListenerWrapper(t *testing.T) {
	at := addr(t)
	globals := "\tservers " + at[strings.IndexByte(at, ':'):] + " {\n\t\tlistener_wrappers {\n\t\t\tlayer4 {\n\t\t\t\troute {\n\t\t\t\t\tinflight 2\n\t\t\t\t}\n\t\t\t}\n\t\t}\n\t}\n"
	c := startCaddy(t, globals, "http://"+at+" {\n\trespond ok\n}\n", at)
	zone := "layer4 " + at[strings.IndexByte(at, ':'):] + "#1" // the HTTP server listens on :port

	// keepAlive sends a request on a new connection and reads its
	// response, leaving the connection open; false if it was closed.
	keepAlive := func(conn net.Conn) (*bufio.Reader, bool) {
		fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", at)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return br, false
		}
		resp.Body.Close()
		return br, resp.StatusCode == http.StatusOK
	}
	first, second := dial(t, at, "127.0.0.1"), dial(t, at, "127.0.0.1")
	for _, conn := range []net.Conn{first, second} {
		if _, ok := keepAlive(conn); !ok {
			t.Fatal("a connection under the cap got no response")
		}
	}
	if held := c.held(t, zone); held != 2 {
		t.Fatalf("held %d with two kept-alive connections open (their handlers returned), want 2", held)
	}
	if _, ok := keepAlive(dial(t, at, "127.0.0.1")); ok {
		t.Fatal("a third connection was served over inflight 2")
	}
	first.Close() // the HTTP server sees it end and closes it
	eventually(t, "the closed connection's slot is given back", func() bool { return c.held(t, zone) == 1 })
	if _, ok := keepAlive(dial(t, at, "127.0.0.1")); !ok {
		t.Fatal("a new connection was refused after one closed")
	}
	if _, ok := keepAlive(second); !ok { // still the same connection, still held
		t.Fatal("the second connection no longer serves")
	}
	if held := c.held(t, zone); held != 2 {
		t.Fatalf("held %d, want 2", held)
	}
}

// TestReloadWithConnectionsOpen: connections opened before a reload keep
// their slots in the zone the new config shares (a named zone whose max
// changes), count against the new max, and are released once each when
// they close.
func TestReloadWithConnectionsOpen(t *testing.T) {
	at := addr(t)
	route := func(max int) string {
		return l4(at, fmt.Sprintf("\t\t\t\tinflight %d {\n\t\t\t\t\tzone db\n\t\t\t\t}\n\t\t\t\techo\n", max))
	}
	c := startCaddy(t, route(2), "", at)
	old := []net.Conn{dial(t, at, "127.0.0.1"), dial(t, at, "127.0.0.1")}
	for _, conn := range old {
		if !echoed(t, conn) {
			t.Fatal("a connection under the cap was closed")
		}
	}
	c.reload(t, route(3), "")
	if held := c.held(t, "db"); held != 2 {
		t.Fatalf("held %d after the reload, want the 2 open connections", held)
	}
	third := dial(t, at, "127.0.0.1")
	if !echoed(t, third) {
		t.Fatal("a third connection was closed under the new max of 3")
	}
	if echoed(t, dial(t, at, "127.0.0.1")) {
		t.Fatal("a fourth connection was admitted over the new max of 3: the old connections stopped counting")
	}
	for _, conn := range old {
		if !echoed(t, conn) {
			t.Fatal("a connection opened before the reload no longer echoes")
		}
		conn.Close()
	}
	eventually(t, "the old connections' slots are given back", func() bool { return c.held(t, "db") == 1 })
	third.Close()
	eventually(t, "every slot is given back", func() bool { return c.held(t, "db") == 0 })
	// Released exactly once: the cap is whole again, not more.
	var open []net.Conn
	for range 3 {
		conn := dial(t, at, "127.0.0.1")
		if !echoed(t, conn) {
			t.Fatal("a connection under the cap was closed after the reload's connections ended")
		}
		open = append(open, conn)
	}
	if echoed(t, dial(t, at, "127.0.0.1")) {
		t.Fatal("a fourth connection was admitted: a slot was given back twice")
	}
	if held := c.held(t, "db"); held != 3 {
		t.Errorf("held %d, want 3", held)
	}
}

// TestFleetCap: two Caddy instances sharing one Redis enforce one cap of
// 2 connections per client across both. Connections wait up to a second:
// the dial by which startCaddy saw an instance listen holds a slot until
// the instance sees it closed, which may come after the idle zone
// startCaddy waits for (the dial not yet admitted) and after the test's
// next connection.
func TestFleetCap(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server is not installed (apt-get install redis-server)")
	}
	redisAddr := addr(t)
	redis := exec.Command("redis-server", "--port", redisAddr[strings.LastIndexByte(redisAddr, ':')+1:], "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := redis.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { redis.Process.Kill(); redis.Wait() })
	waitForPort(t, redisAddr)

	route := "\t\t\t\tinflight 2 {\n\t\t\t\t\tzone fleet\n\t\t\t\t\twait 1s\n\t\t\t\t\tstore redis {\n\t\t\t\t\t\taddress " + redisAddr + "\n\t\t\t\t\t}\n\t\t\t\t}\n\t\t\t\techo\n"
	a, b := addr(t), addr(t)
	ca := startCaddy(t, l4(a, route), "", a)
	cb := startCaddy(t, l4(b, route), "", b)

	onA := dial(t, a, "127.0.0.1")
	if !echoed(t, onA) || !echoed(t, dial(t, b, "127.0.0.1")) {
		t.Fatal("a connection under the fleet's cap was closed")
	}
	for _, at := range []string{a, b} {
		if echoed(t, dial(t, at, "127.0.0.1")) {
			t.Fatalf("a third connection was admitted on %s over the fleet's cap of 2", at)
		}
	}
	onA.Close()
	eventually(t, "instance A gives its slot back", func() bool { return ca.held(t, "fleet") == 0 })
	eventually(t, "instance B admits a connection once A's closed", func() bool { return echoed(t, dial(t, b, "127.0.0.1")) })
	if held := cb.held(t, "fleet"); held != 2 {
		t.Errorf("instance B holds %d, want 2", held)
	}
	if refused := ca.zone(t, "fleet").Refused["timeout"] + cb.zone(t, "fleet").Refused["timeout"]; refused < 2 {
		t.Errorf("%d refusals counted (timeout: refused after the wait), want at least 2", refused)
	}
}

// TestBadConfigRefused: Caddy refuses to start on a bad value, with a
// message that names the option, the value and what is allowed.
func TestBadConfigRefused(t *testing.T) {
	for _, tc := range []struct{ block, want string }{
		{"inflight 0", `inflight: max "0" is not allowed: want an integer from 1 to 1099511627775 (2^40-1), at `},
		{"inflight 2 {\n\tkey_prefix 33\n}", `inflight: key_prefix ipv4 "33" is not allowed: want a prefix length 1-32`},
		{"inflight 2 {\n\tkey_prefix 24 0\n}", `inflight: key_prefix ipv6 "0" is not allowed: want a prefix length 1-128`},
		{"inflight {\n\tlimit db {l4.conn.remote_ip} {l4.vars.max}\n}", `inflight: limit db: max "{l4.vars.max}" is not allowed: want an integer from 1 to 1099511627775 (2^40-1), at `},
		{"inflight 2 {\n\tstatus 503\n}", `inflight: unknown subdirective "status": want one of limit, total`},
		{"inflight 2 {\n\tfair tenant\n}", `inflight: fair "tenant" is not allowed: want the name of one of this handler's limits`},
		{"inflight 2 {\n\twait soon\n}", `inflight: wait "soon" is not allowed: want a duration such as 30s, or 0`},
		{"inflight {\n\tzone db\n}", "inflight: no limit: give a max (inflight 20), a limit or a total"},
		{"inflight {\n\tlimit conn {l4.conn.remote_addr} 2\n}", `inflight: limit conn: key "{l4.conn.remote_addr}" is not allowed: {l4.conn.remote_addr} includes the client's port, so every connection would be a key of its own; want {l4.conn.remote_ip}, the client's address, at /`},
	} {
		at := addr(t)
		dir := t.TempDir()
		cfg := "{\n\tadmin off\n" + l4(at, indentBlock(tc.block)) + "}\n"
		file := filepath.Join(dir, "Caddyfile")
		if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(caddyBinary(t), "run", "--adapter", "caddyfile", "--config", file)
		cmd.Env = append(cmd.Environ(), "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
		done := make(chan struct{})
		var out []byte
		var err error
		go func() { out, err = cmd.CombinedOutput(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Fatalf("%q: Caddy started", tc.block)
		}
		logged := strings.ReplaceAll(string(out), `\"`, `"`) // JSON log lines
		if err == nil || !strings.Contains(logged, tc.want) || !strings.Contains(logged, file+":") {
			t.Errorf("%q: exit %v, output lacks %q at %s:<line>:\n%s", tc.block, err, tc.want, file, out)
		}
	}
}

// indentBlock indents a handler block into the route of l4.
func indentBlock(block string) string {
	var b strings.Builder
	for _, l := range strings.Split(block, "\n") {
		b.WriteString("\t\t\t\t" + l + "\n")
	}
	return b.String()
}
