package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/redis/go-redis/v9"
)

// levelSites is one instance's Caddyfile for the fleet's RateLimit
// fields: at port, tenant limit 5 with waiting (zone levels); at costPort,
// tenant limit 10 with a cost and no waiting (zone levels-cost); both kept
// in the Redis at redisAddr, failing open.
func levelSites(port, costPort int, redisAddr, backend string) string {
	store := fmt.Sprintf("store redis {\n\t\t\taddress %s\n\t\t\ttimeout 1s\n\t\t\ton_error open\n\t\t}", redisAddr)
	return fmt.Sprintf(`{
	admin off
	default_bind 127.0.0.1
	auto_https off
	persist_config off
	log {
		output discard
	}
}
http://127.0.0.1:%d {
	inflight {
		limit tenant {header.X-Tenant} 5
		zone levels
		wait 30s
		limit_headers tenant
		%s
	}
	reverse_proxy %s
}
http://127.0.0.1:%d {
	inflight {
		limit tenant {header.X-Tenant} 10
		zone levels-cost
		cost {header.X-Cost}
		limit_headers tenant
		%s
	}
	reverse_proxy %s
}
`, port, store, backend, costPort, store, backend)
}

// fields is a response's status and RateLimit fields.
type fields struct {
	status         int
	policy, remain string
}

func (f fields) String() string {
	return fmt.Sprintf("%d, RateLimit-Policy: %s, RateLimit: %s", f.status, f.policy, f.remain)
}

// fieldsOf sends a GET with the headers given as name, value pairs and
// returns its status and RateLimit fields once it ended.
func fieldsOf(t *testing.T, c *http.Client, url string, header ...string) fields {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Error(err)
		return fields{}
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return fields{resp.StatusCode, resp.Header.Get("RateLimit-Policy"), resp.Header.Get("RateLimit")}
}

// TestLimitHeadersFromTheFleet: two Caddy processes share one Redis; a
// request at instance A sees in its RateLimit field the units its key
// holds across the fleet, those held at instance B included: admitted at
// once, admitted after waiting (the level of the call that admitted it),
// and with a cost (units, no quota unit) admitted and refused. While
// Redis is down (on_error open), A sends its own level, marked
// inflight-scope="instance".
func TestLimitHeadersFromTheFleet(t *testing.T) {
	r := startRedis(t)
	b := newBackend(t)
	portA, costA, portB, costB := freePort(t), freePort(t), freePort(t), freePort(t)
	startCaddy(t, levelSites(portA, costA, r.addr, b.addr), portA)
	startCaddy(t, levelSites(portB, costB, r.addr, b.addr), portB)
	waitForPort(t, fmt.Sprintf("127.0.0.1:%d", costA))
	waitForPort(t, fmt.Sprintf("127.0.0.1:%d", costB))
	urlA, urlB := fmt.Sprintf("http://127.0.0.1:%d", portA), fmt.Sprintf("http://127.0.0.1:%d", portB)
	costURLA, costURLB := fmt.Sprintf("http://127.0.0.1:%d", costA), fmt.Sprintf("http://127.0.0.1:%d", costB)
	c := client("127.0.0.1")
	const policy = `"tenant";q=5;qu="concurrent-requests"`
	check := func(what string, got, want fields) {
		t.Helper()
		if got != want {
			t.Errorf("%s:\n\t%v\nwant\n\t%v", what, got, want)
		}
	}

	// 3 held at B: A's request is the 4th of the fleet, 1 left.
	var cancels []context.CancelFunc
	var held []<-chan result
	holdAt := func(url string, header ...string) {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		held = append(held, hold(t, b, ctx, c, url+"/hold", header...))
	}
	for range 3 {
		holdAt(urlB, "X-Tenant", "acme")
	}
	check("admitted at A, 3 held at B", fieldsOf(t, c, urlA+"/", "X-Tenant", "acme"), fields{200, policy, `"tenant";r=1`})
	check("another tenant at A", fieldsOf(t, c, urlA+"/", "X-Tenant", "other"), fields{200, policy, `"tenant";r=4`})

	// 3 held at B, 2 at A: a third at A waits; when one at B ends, it is
	// admitted with the fleet's 5 held (2 at B, 3 at A): none left.
	holdAt(urlA, "X-Tenant", "acme")
	holdAt(urlA, "X-Tenant", "acme")
	rc := redis.NewClient(&redis.Options{Addr: r.addr})
	defer rc.Close()
	waited := make(chan fields, 1)
	go func() { waited <- fieldsOf(t, c, urlA+"/", "X-Tenant", "acme") }()
	eventually(t, "a request waits at A, reported to the fleet", func() bool { return fleetReports(rc) > 0 })
	cancels[0]() // one of B's ends
	check("admitted at A after waiting", <-waited, fields{200, policy, `"tenant";r=0`})

	// With a cost, in units: 7 held at B (4 and 3); 2 more at A leave 1,
	// and 4 more are refused, 3 left.
	holdAt(costURLB, "X-Tenant", "acme", "X-Cost", "4")
	holdAt(costURLB, "X-Tenant", "acme", "X-Cost", "3")
	check("cost 2 at A, 7 units held at B", fieldsOf(t, c, costURLA+"/", "X-Tenant", "acme", "X-Cost", "2"), fields{200, `"tenant";q=10`, `"tenant";r=1`})
	check("cost 4 at A, 7 units held at B", fieldsOf(t, c, costURLA+"/", "X-Tenant", "acme", "X-Cost", "4"), fields{429, `"tenant";q=10`, `"tenant";r=3`})

	// Redis down: A decides alone, with its own counts (2 held here, and
	// this one), and says so.
	r.stop()
	check("admitted at A while Redis is down", fieldsOf(t, c, urlA+"/", "X-Tenant", "acme"),
		fields{200, policy + `;inflight-scope="instance"`, `"tenant";r=2`})

	for _, cancel := range cancels {
		cancel()
	}
	b.open()
	for _, h := range held {
		<-h
	}
}
