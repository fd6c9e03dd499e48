package integration

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// behaviour is what a client of the fault suite does with each request.
type behaviour int

const (
	finishes behaviour = iota // GET held 50-300 ms, read to the end
	cancels                   // gives up after 10-400 ms, waiting or being served
	resets                    // raw connection reset at once or 10-300 ms after the request
	posts                     // POST with a body, may wait; half of them give up
	polite                    // one short request at a time, with pauses
	streams                   // held longer than a lease: renewal keeps it counted
)

// tenantLoad is one tenant's clients: how many, and the behaviours they
// draw from at random.
type tenantLoad struct {
	key     string
	clients int
	mix     []behaviour
}

// rude is a mix of every impolite behaviour.
var rude = []behaviour{finishes, finishes, cancels, resets, posts}

// outcome is one request as its client saw it; status 0 when it got no
// response (it gave up or was reset).
type outcome struct {
	id         int // X-Request-Id: the recorder's events name it
	key        string
	cost       int // the units it asked for (1 without costs)
	instance   int // the fleet member it was sent to
	sent, done time.Time
	// gaveUp is when its client went (its deadline, the halt, or the
	// reset), if it did: Caddy gives its slot back once it sees that,
	// before the upstream connection's close reaches the backend.
	gaveUp time.Time
	status int
}

// traffic runs clients against a fleet until halted, recording outcomes.
type traffic struct {
	urls       []string
	maxCost    int // each request costs 1 to maxCost units (X-Cost)
	streamHold time.Duration
	client     *http.Client
	ctx        context.Context // ends every request in flight at halt
	halt       context.CancelFunc
	halted     time.Time // when halt was called; set before it
	wg         sync.WaitGroup
	ids        atomic.Int64

	mu       sync.Mutex
	outcomes []outcome
}

func startTraffic(t *testing.T, urls []string, maxCost int, streamHold time.Duration, loads ...tenantLoad) *traffic {
	t.Helper()
	tr := &traffic{
		urls:       urls,
		maxCost:    maxCost,
		streamHold: streamHold,
		client:     &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second},
	}
	tr.ctx, tr.halt = context.WithCancel(context.Background())
	for _, l := range loads {
		for range l.clients {
			tr.wg.Add(1)
			go tr.run(l)
		}
	}
	t.Cleanup(tr.stop)
	return tr
}

// stop ends the clients and their requests in flight, and waits for them.
func (tr *traffic) stop() {
	tr.mu.Lock()
	if tr.halted.IsZero() {
		tr.halted = time.Now()
	}
	tr.mu.Unlock()
	tr.halt()
	tr.wg.Wait()
}

func (tr *traffic) run(l tenantLoad) {
	defer tr.wg.Done()
	for {
		if tr.ctx.Err() != nil {
			return
		}
		b := l.mix[rand.IntN(len(l.mix))]
		o := outcome{id: int(tr.ids.Add(1)), key: l.key, cost: 1 + rand.IntN(tr.maxCost), instance: rand.IntN(len(tr.urls))}
		o.sent = time.Now()
		o.status, o.gaveUp = tr.send(b, o, tr.urls[o.instance])
		o.done = time.Now()
		tr.mu.Lock()
		tr.outcomes = append(tr.outcomes, o)
		tr.mu.Unlock()
		switch {
		case b == polite:
			time.Sleep(50 * time.Millisecond)
		case o.status != http.StatusOK: // refused or failed: retry soon, not in a hot loop
			time.Sleep(time.Duration(10+rand.IntN(10)) * time.Millisecond)
		}
	}
}

// send makes o's request and returns its status (0: no response) and
// when its client gave up on it (zero if it did not).
func (tr *traffic) send(b behaviour, o outcome, base string) (status int, gaveUp time.Time) {
	ms := 50 + rand.IntN(250)
	ctx := tr.ctx
	method, body := http.MethodGet, ""
	switch b {
	case polite:
		ms = 20
	case streams:
		ms = int(tr.streamHold.Milliseconds())
	case cancels:
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(10+rand.IntN(390))*time.Millisecond)
		defer cancel()
	case resets:
		after := time.Duration(0) // half of them at once: gone before Caddy asks Redis
		if rand.IntN(2) == 0 {
			after = time.Duration(10+rand.IntN(290)) * time.Millisecond
		}
		return 0, resetAfterSending(base, o, ms, after)
	case posts:
		method, body = http.MethodPost, strings.Repeat("x", 4096)
		if rand.IntN(2) == 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, time.Duration(50+rand.IntN(550))*time.Millisecond)
			defer cancel()
		}
	}
	req, _ := http.NewRequestWithContext(ctx, method, fmt.Sprintf("%s/work?ms=%d", base, ms), strings.NewReader(body))
	req.Header.Set("X-Tenant", o.key)
	req.Header.Set("X-Cost", strconv.Itoa(o.cost))
	req.Header.Set("X-Request-Id", strconv.Itoa(o.id))
	resp, err := tr.client.Do(req)
	if err == nil {
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
	}
	if err != nil {
		return 0, tr.wentAt(ctx)
	}
	return resp.StatusCode, time.Time{}
}

// wentAt is when a request whose context ended was given up: its
// deadline, or the halt; before either the transport closes its
// connection.
func (tr *traffic) wentAt(ctx context.Context) time.Time {
	if ctx.Err() == nil {
		return time.Time{} // it failed on its own: no response, not given up
	}
	tr.mu.Lock()
	halted := tr.halted
	tr.mu.Unlock()
	if d, ok := ctx.Deadline(); ok && (halted.IsZero() || d.Before(halted)) {
		return d
	}
	return halted
}

// resetAfterSending sends a request on a raw connection and resets the
// connection (RST) after a while, as a client that vanishes does. It
// returns when it reset it.
func resetAfterSending(base string, o outcome, ms int, after time.Duration) time.Time {
	u, _ := url.Parse(base)
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		return time.Time{}
	}
	fmt.Fprintf(c, "GET /work?ms=%d HTTP/1.1\r\nHost: %s\r\nX-Tenant: %s\r\nX-Cost: %d\r\nX-Request-Id: %d\r\n\r\n", ms, u.Host, o.key, o.cost, o.id)
	time.Sleep(after)
	c.(*net.TCPConn).SetLinger(0)
	reset := time.Now()
	c.Close()
	return reset
}

// all returns every request made so far.
func (tr *traffic) all() []outcome {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.outcomes)
}

// refusals returns the requests refused (429, or 503).
func (tr *traffic) refusals() []outcome {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []outcome
	for _, o := range tr.outcomes {
		if o.status == http.StatusTooManyRequests || o.status == http.StatusServiceUnavailable {
			out = append(out, o)
		}
	}
	return out
}

// statuses counts the outcomes by status, per tenant.
func (tr *traffic) statuses() map[string]map[int]int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	m := map[string]map[int]int{}
	for _, o := range tr.outcomes {
		if m[o.key] == nil {
			m[o.key] = map[int]int{}
		}
		m[o.key][o.status]++
	}
	return m
}
