package integration

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// occupancyHold is how long the backend holds each request of the
// occupancy runs.
const occupancyHold = 200 * time.Millisecond

// TestFleetOccupancyUnderLatency measures how much of a tenant's cap the
// backend holds while its requests queue, with Redis a round trip L away
// (L/2 each way, through a fault proxy per instance), over 4 s after 3 s
// of warm-up. A slot a request frees goes to a waiter of its instance
// with no round trip (docs/fleet-guarantees.md, "Hand-offs"); the test
// wants at least 0.9 of the cap. Three cases:
//   - busy: three instances, 4 clients each without pause under a cap of
//     6: each instance's share is 2, and 2 more of its requests wait;
//   - one more than its share: the same with 3 clients each, so an
//     instance often has all its requests in flight, and a client's next
//     request comes after its instance gave the unit back (another
//     waits). Asked for as a newcomer, not queued, it was not demand in
//     the fleet's targets, and such an instance went on asking per
//     request: at L = 100 ms the backend held 0.70-0.72 of the cap;
//   - quiet: one instance, 2 clients under a cap of 1, each pausing 100 ms
//     after an answer: each release finds no call under way.
func TestFleetOccupancyUnderLatency(t *testing.T) {
	cases := []struct {
		name              string
		instances, cap, n int
		think             time.Duration
	}{
		{"busy", 3, 6, 4, 0},
		{"one more than its share", 3, 6, 3, 0},
		{"quiet", 1, 1, 2, 100 * time.Millisecond},
	}
	for _, c := range cases {
		for _, l := range []time.Duration{0, 10 * time.Millisecond, 100 * time.Millisecond} {
			t.Run(fmt.Sprintf("%s/L=%s", c.name, l), func(t *testing.T) {
				r := startRedis(t)
				var proxies []*faultProxy
				var addrs []string
				for range c.instances {
					p := newFaultProxy(t, r.addr)
					p.SetLatency(l / 2)
					proxies, addrs = append(proxies, p), append(addrs, p.addr)
				}
				e := startFaultFleet(t, faultSite{onError: "closed"}, caps{tenant: c.cap}, addrs...)
				stop := make(chan struct{})
				var wg sync.WaitGroup
				for _, m := range e.fleet {
					for range c.n {
						wg.Add(1)
						go func() {
							defer wg.Done()
							occupancyClient(m.url, c.think, stop)
						}()
					}
				}
				time.Sleep(3 * time.Second) // every client queued, the targets settled
				from := time.Now()
				time.Sleep(4 * time.Second)
				to := time.Now()
				close(stop)
				wg.Wait()
				mean := e.rec.meanHeld("a", from, to)
				got := mean / float64(c.cap)
				t.Logf("%s, L=%s: the backend held %.2f of %d on average: %.2f of the cap", c.name, l, mean, c.cap, got)
				if got < 0.9 {
					t.Errorf("%s, L=%s: the backend held %.2f of the cap on average, want at least 0.9", c.name, l, got)
				}
			})
		}
	}
}

// occupancyClient sends tenant a's requests to url, one at a time, each
// think after the previous one's answer, until stop is closed.
func occupancyClient(url string, think time.Duration, stop chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(think):
		}
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/?ms=%d", url, occupancyHold.Milliseconds()), nil)
		req.Header.Set("X-Tenant", "a")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
	}
}

// meanHeld returns the units key held at the backend on average from from
// to to.
func (rec *recorder) meanHeld(key string, from, to time.Time) float64 {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	held, at, sum := 0, from, 0.0
	for _, e := range rec.events {
		if e.key != key {
			continue
		}
		if e.at.After(from) {
			end := e.at
			if end.After(to) {
				end = to
			}
			if end.After(at) {
				sum += float64(held) * end.Sub(at).Seconds()
				at = end
			}
		}
		held += e.delta
	}
	if to.After(at) {
		sum += float64(held) * to.Sub(at).Seconds()
	}
	return sum / to.Sub(from).Seconds()
}
