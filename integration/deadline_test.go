package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// deadlineBackend holds each request for its X-Hold (a Go duration; "gate"
// holds it until release is closed) and records whether it arrived after
// its client's deadline: X-Sent (the client's clock, unix nanoseconds)
// plus its X-Request-Timeout, or its grpc-timeout in milliseconds.
type deadlineBackend struct {
	addr    string
	release chan struct{}
	arrived atomic.Int64
	late    atomic.Int64
	worst   atomic.Int64 // the latest dlArrival relative to its deadline, ns (negative: before)
}

func newDeadlineBackend(t *testing.T) *deadlineBackend {
	b := &deadlineBackend{release: make(chan struct{})}
	b.worst.Store(-1 << 62)
	b.addr = serveAt(t, "127.0.0.1:0", b)
	t.Cleanup(func() { b.open() })
	return b
}

func (b *deadlineBackend) open() {
	select {
	case <-b.release:
	default:
		close(b.release)
	}
}

func (b *deadlineBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	b.arrived.Add(1)
	if sent, err := strconv.ParseInt(r.Header.Get("X-Sent"), 10, 64); err == nil {
		var left time.Duration
		if v := r.Header.Get("X-Request-Timeout"); v != "" {
			left, _ = time.ParseDuration(v)
		} else if v := r.Header.Get("Grpc-Timeout"); len(v) > 1 && v[len(v)-1] == 'm' {
			ms, _ := strconv.Atoi(v[:len(v)-1])
			left = time.Duration(ms) * time.Millisecond
		}
		if left > 0 {
			by := now.Sub(time.Unix(0, sent).Add(left))
			for w := b.worst.Load(); int64(by) > w && !b.worst.CompareAndSwap(w, int64(by)); w = b.worst.Load() {
			}
			if by > 0 {
				b.late.Add(1)
			}
		}
	}
	switch h := r.Header.Get("X-Hold"); h {
	case "gate":
		select {
		case <-b.release:
		case <-r.Context().Done():
		}
	case "":
	default:
		d, _ := time.ParseDuration(h)
		time.Sleep(d)
	}
	w.Write([]byte("ok"))
}

// deadlineSite is a zone with a total of 2, a long wait and deadlines from
// X-Request-Timeout.
func deadlineSite(t *testing.T, b *deadlineBackend, zone string, early bool) string {
	port := freePort(t)
	opt := ""
	if early {
		opt = "early_refusal"
	}
	load(t, fmt.Sprintf(`http://127.0.0.1:%d {
	inflight {
		total 2
		zone %s
		wait 30s
		max_waiting 10000
		deadline {header.X-Request-Timeout}
		%s
	}
	reverse_proxy %s
}
`, port, zone, opt, b.addr))
	return fmt.Sprintf("http://127.0.0.1:%d", port)
}

// timed sends one request stamped with X-Sent and returns its result and
// how long it took.
func dlTimed(c *http.Client, url string, header ...string) (result, time.Duration) {
	start := time.Now()
	r := get(context.Background(), c, url, append(header, "X-Sent", strconv.FormatInt(start.UnixNano(), 10))...)
	return r, time.Since(start)
}

// With 2 long requests in flight and 20 queued behind them, a request with
// a 300 ms deadline is refused at dlArrival (early refusal), not after
// waiting 270 ms; without early refusal it waits its 270 ms.
func TestDeadlineEarlyRefusalLatency(t *testing.T) {
	b := newDeadlineBackend(t)
	url := deadlineSite(t, b, "deadline-latency", true)
	c := client("127.0.0.1")
	// The zone's grant rate: 2 slots freed every 50 ms, 40/s.
	for range 8 {
		burst(c, 2, url, "X-Hold", "50ms")
	}
	var held sync.WaitGroup
	for range 22 {
		held.Go(func() { get(context.Background(), c, url, "X-Hold", "gate") })
	}
	eventually(t, "20 wait", func() bool { return metric(t, "caddy_inflight_waiting", `zone="deadline-latency"`) == 20 })

	var lat []time.Duration
	for range 30 {
		r, d := dlTimed(c, url, "X-Request-Timeout", "300ms")
		if r.err != nil || r.status != 429 {
			t.Fatalf("deadline request: %d %v, want 429", r.status, r.err)
		}
		lat = append(lat, d)
	}
	slices.Sort(lat)
	p50, p90, worst := lat[len(lat)/2], lat[len(lat)*9/10], lat[len(lat)-1]
	t.Logf("early refusal with 20 queued ahead: latency p50 %s, p90 %s, max %s (of %d)", p50, p90, worst, len(lat))
	if p50 > 10*time.Millisecond || worst > 100*time.Millisecond {
		t.Errorf("refused in p50 %s, max %s: want p50 within 10ms and every one well before its 270ms wait (100ms)", p50, worst)
	}

	// Without early refusal the same request waits out what its deadline
	// allows (270 ms), and is refused then.
	url2 := deadlineSite(t, b, "deadline-latency", false)
	r, d := dlTimed(c, url2, "X-Request-Timeout", "300ms")
	t.Logf("without early refusal: %d after %s", r.status, d)
	if r.status != 429 || d < 260*time.Millisecond || d > 300*time.Millisecond {
		t.Errorf("without early refusal: %d after %s, want 429 after 270ms (before the 300ms deadline)", r.status, d)
	}
	b.open()
	held.Wait()
	eventually(t, "the zone drains", func() bool {
		return metric(t, "caddy_inflight_waiting", `zone="deadline-latency"`) == 0 &&
			metric(t, "caddy_inflight_units", `zone="deadline-latency"`) == 0
	})
}

// dlArrival is one request of a replayed schedule.
type dlArrival struct {
	at       time.Duration // after the start
	deadline time.Duration
	grpc     int // 0: X-Request-Timeout, 1: grpc-timeout, 2: a malformed grpc-timeout with X-Request-Timeout
}

// schedule is n arrivals at rate per second (exponential gaps), with
// deadlines uniform in [lo, hi), from seed.
func dlSchedule(seed uint64, n int, rate float64, lo, hi time.Duration) []dlArrival {
	rnd := rand.New(rand.NewPCG(seed, seed))
	var at time.Duration
	out := make([]dlArrival, n)
	for i := range out {
		at += time.Duration(rnd.ExpFloat64() / rate * float64(time.Second))
		out[i] = dlArrival{at: at, deadline: lo + time.Duration(rnd.Int64N(int64(hi-lo))).Truncate(time.Millisecond), grpc: rnd.IntN(3)}
	}
	return out
}

type dlOutcome struct {
	status  int
	latency time.Duration
	err     error
}

// replay sends the arrivals on their schedule, each held 100 ms by the
// backend once admitted, and returns their outcomes in order.
func dlReplay(c *http.Client, url string, as []dlArrival) []dlOutcome {
	out := make([]dlOutcome, len(as))
	var wg sync.WaitGroup
	start := time.Now()
	for i, a := range as {
		time.Sleep(time.Until(start.Add(a.at)))
		h := []string{"X-Hold", "100ms"}
		switch a.grpc {
		case 0:
			h = append(h, "X-Request-Timeout", a.deadline.String())
		case 1:
			h = append(h, "Content-Type", "application/grpc", "Grpc-Timeout", strconv.FormatInt(a.deadline.Milliseconds(), 10)+"m")
		case 2:
			h = append(h, "Content-Type", "application/grpc", "Grpc-Timeout", []string{"1x", "999999999m", "-5S", "S", "1.5S"}[i%5], "X-Request-Timeout", a.deadline.String())
		}
		wg.Go(func() {
			r, d := dlTimed(c, url, h...)
			out[i] = dlOutcome{r.status, d, r.err}
		})
	}
	wg.Wait()
	return out
}

// Requests with deadlines from 150 ms to 1.5 s arrive at 30/s at a zone
// that serves 20/s (2 slots, 100 ms each), a third with grpc-timeout, a
// third with a malformed one (ignored: their X-Request-Timeout counts).
// The backend sees no request after its deadline, early refusal on or off,
// and no slot leaks.
func TestDeadlineNoLateAdmission(t *testing.T) {
	as := dlSchedule(7, 150, 30, 150*time.Millisecond, 1500*time.Millisecond)
	c := client("127.0.0.1")
	for _, early := range []bool{false, true} {
		b := newDeadlineBackend(t)
		zone := fmt.Sprintf("deadline-late-%v", early)
		url := deadlineSite(t, b, zone, early)
		out := dlReplay(c, url, as)
		st := map[int]int{}
		for _, o := range out {
			if o.err != nil {
				t.Fatalf("request failed: %v", o.err)
			}
			st[o.status]++
		}
		t.Logf("early refusal %v: %d arrived at the backend, %d late, latest %s after its deadline (negative: before); statuses %v",
			early, b.arrived.Load(), b.late.Load(), time.Duration(b.worst.Load()), st)
		if b.late.Load() != 0 {
			t.Errorf("early refusal %v: %d requests reached the backend after their deadline", early, b.late.Load())
		}
		if st[200] == 0 || st[429] == 0 {
			t.Errorf("early refusal %v: statuses %v, want both admissions and refusals", early, st)
		}
		eventually(t, "the zone drains", func() bool {
			return metric(t, "caddy_inflight_waiting", `zone="`+zone+`"`) == 0 &&
				metric(t, "caddy_inflight_units", `zone="`+zone+`"`) == 0
		})
	}
}

// earlyCut tells an early refusal (at dlArrival) from a refusal after a wait:
// the shortest wait a deadline here allows is 135 ms.
const earlyCut = 60 * time.Millisecond

// The same arrivals, replayed with early refusal on, then off: of the
// requests refused early, how many timed out when they were let wait
// (precision), and how many of the timeouts were refused early (recall).
func TestDeadlineEarlyRefusalPrecision(t *testing.T) {
	as := dlSchedule(42, 600, 30, 150*time.Millisecond, 1500*time.Millisecond)
	c := client("127.0.0.1")
	var runs [2][]dlOutcome
	for i, early := range []bool{true, false} {
		b := newDeadlineBackend(t)
		url := deadlineSite(t, b, fmt.Sprintf("deadline-precision-%v", early), early)
		runs[i] = dlReplay(c, url, as)
		if b.late.Load() != 0 {
			t.Errorf("early refusal %v: %d admitted after their deadline", early, b.late.Load())
		}
	}
	on, off := runs[0], runs[1]
	var early, earlyTimedOut, timedOut, lateRefusalsOn int
	for i := range as {
		if on[i].err != nil || off[i].err != nil {
			t.Fatalf("request %d failed: %v / %v", i, on[i].err, off[i].err)
		}
		refusedOff := off[i].status == 429
		if refusedOff {
			timedOut++
		}
		switch {
		case on[i].status == 429 && on[i].latency < earlyCut:
			early++
			if refusedOff {
				earlyTimedOut++
			}
		case on[i].status == 429:
			lateRefusalsOn++
		}
	}
	if early == 0 {
		t.Fatal("nothing refused early")
	}
	precision := float64(earlyTimedOut) / float64(early)
	t.Logf("%d arrivals: early refusal on: %d refused early, %d refused after waiting; off: %d timed out. Precision %d/%d = %.1f %%, recall %d/%d = %.1f %%",
		len(as), early, lateRefusalsOn, timedOut, earlyTimedOut, early, 100*precision, earlyTimedOut, timedOut, 100*float64(earlyTimedOut)/float64(max(timedOut, 1)))
	if precision < 0.90 {
		t.Errorf("precision %.1f %%: want at least 90 %% of the requests refused early to have timed out with early refusal off (the bound docs/waiting.md states)", 100*precision)
	}
}
