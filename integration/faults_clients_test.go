package integration

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
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
	key        string
	cost       int // the units it asked for (1 without costs)
	sent, done time.Time
	status     int
}

// traffic runs clients against a fleet until halted, recording outcomes.
type traffic struct {
	urls       []string
	maxCost    int // each request costs 1 to maxCost units (X-Cost)
	streamHold time.Duration
	client     *http.Client
	ctx        context.Context // ends every request in flight at halt
	halt       context.CancelFunc
	wg         sync.WaitGroup

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
		// Each tenant's requests have one cost (1 to maxCost by tenant): a
		// waiter for more units holds back its tenant's smaller ones behind
		// it (no starvation), which the checker would count as refusals
		// with room.
		o := outcome{key: l.key, cost: 1 + int(l.key[0])%tr.maxCost, sent: time.Now()}
		o.status = tr.send(b, o, tr.urls[rand.IntN(len(tr.urls))])
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

// send makes o's request and returns its status (0: no response).
func (tr *traffic) send(b behaviour, o outcome, base string) int {
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
		resetAfterSending(base, o, ms, after)
		return 0
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
	resp, err := tr.client.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0
	}
	return resp.StatusCode
}

// resetAfterSending sends a request on a raw connection and resets the
// connection (RST) after a while, as a client that vanishes does.
func resetAfterSending(base string, o outcome, ms int, after time.Duration) {
	u, _ := url.Parse(base)
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		return
	}
	fmt.Fprintf(c, "GET /work?ms=%d HTTP/1.1\r\nHost: %s\r\nX-Tenant: %s\r\nX-Cost: %d\r\n\r\n", ms, u.Host, o.key, o.cost)
	time.Sleep(after)
	c.(*net.TCPConn).SetLinger(0)
	c.Close()
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
