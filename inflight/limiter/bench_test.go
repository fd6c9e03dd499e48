package limiter

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/fleet"
)

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "198.51." + strconv.Itoa(i/256%256) + "." + strconv.Itoa(i%256) + "/" + strconv.Itoa(i)
	}
	return keys
}

// admitRelease is the benchmark loop of one request through z: admit, then
// release.
func admitRelease(b *testing.B, z *Zone, r *Request) {
	b.ReportAllocs()
	for b.Loop() {
		slot, _ := z.TryAcquire(r)
		if slot == nil {
			b.Fatal("refused")
		}
		slot.Release()
	}
}

// BenchmarkAdmitRelease is one request through one keyed limit: admit, then
// release.
func BenchmarkAdmitRelease(b *testing.B) {
	z := NewZone(1, false, nil)
	admitRelease(b, z, &Request{Keys: []string{"198.51.100.7"}, Max: []int64{0}, Limits: &Limits{Max: []int64{100}}})
}

// BenchmarkRefuse is a request over its cap.
func BenchmarkRefuse(b *testing.B) {
	z := NewZone(1, false, nil)
	r := &Request{Keys: []string{"198.51.100.7"}, Max: []int64{0}, Limits: &Limits{Max: []int64{1}}}
	z.TryAcquire(r)
	b.ReportAllocs()
	for b.Loop() {
		if slot, _ := z.TryAcquire(r); slot != nil {
			b.Fatal("admitted")
		}
	}
}

// BenchmarkAcquireWaitMode is admit + release through Acquire with a wait
// configured but no queue: the path a wait-mode handler takes when there is
// room.
func BenchmarkAcquireWaitMode(b *testing.B) {
	z := NewZone(1, false, nil)
	r := &Request{Keys: []string{"198.51.100.7"}, Max: []int64{0}, Limits: &Limits{Max: []int64{100}}}
	opt := WaitOptions{Wait: 1e9, MaxWaiting: 10}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if res := z.Acquire(ctx, r, opt); res.Outcome != Admitted {
			b.Fatal("refused")
		}
		r.slot.Release()
	}
}

// BenchmarkParallelKeys spreads admit + release over 10,000 keys from every
// CPU; compare -cpu 1,2 for scaling.
func BenchmarkParallelKeys(b *testing.B) {
	keys := benchKeys(10_000)
	z := NewZone(1, false, nil)
	lim := &Limits{Max: []int64{1 << 30}}
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7919))
		// Each goroutine's request on its own cache lines, so the benchmark
		// measures the zone, not false sharing between its own requests.
		keyBuf := make([]string, 8)
		padded := &struct {
			_ [cacheLine]byte
			r Request
			_ [cacheLine]byte
		}{}
		r := &padded.r
		*r = Request{Keys: keyBuf[:1], Max: make([]int64, 8)[:1], Limits: lim}
		for pb.Next() {
			i++
			r.Keys[0] = keys[i%len(keys)]
			z.TryAcquire(r)
			r.slot.Release()
		}
	})
}

// BenchmarkBesideWaiters is another key's admit + release in a zone where
// 0 or 10,000 requests of one key wait at that key's cap: the waiters it
// cannot unblock must not cost it anything.
func BenchmarkBesideWaiters(b *testing.B) {
	for _, waiters := range []int{0, 10_000} {
		b.Run("waiters="+strconv.Itoa(waiters), func(b *testing.B) {
			z := NewZone(1, true, nil)
			lim := &Limits{Max: []int64{1}, Total: 1 << 20}
			full := &Request{Keys: []string{"203.0.113.9"}, Max: []int64{0}, Limits: lim}
			z.TryAcquire(full)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{}, waiters)
			for range waiters {
				go func() {
					z.Acquire(ctx, &Request{Keys: []string{"203.0.113.9"}, Max: []int64{0}, Limits: lim}, WaitOptions{Wait: time.Hour})
					done <- struct{}{}
				}()
			}
			for waitingIn(z) < int64(waiters) {
				time.Sleep(time.Millisecond)
			}
			admitRelease(b, z, &Request{Keys: []string{"198.51.100.7"}, Max: []int64{0}, Limits: lim})
			b.StopTimer()
			cancel()
			for range waiters {
				<-done
			}
		})
	}
}

// BenchmarkAdmitReleaseMaxKeys is BenchmarkAdmitRelease under max_keys, for
// a key already in flight (the path max_keys must not slow down) and for a
// key new each time (which max_keys counts).
func BenchmarkAdmitReleaseMaxKeys(b *testing.B) {
	lim := &Limits{Max: []int64{100}, MaxKeys: 1000}
	b.Run("present", func(b *testing.B) {
		z := NewZone(1, false, nil)
		z.TryAcquire(&Request{Keys: []string{"198.51.100.7"}, Max: []int64{0}, Limits: lim})
		admitRelease(b, z, &Request{Keys: []string{"198.51.100.7"}, Max: []int64{0}, Limits: lim})
	})
	b.Run("new", func(b *testing.B) {
		z := NewZone(1, false, nil)
		admitRelease(b, z, &Request{Keys: []string{"198.51.100.7"}, Max: []int64{0}, Limits: lim})
	})
}

// BenchmarkAdaptiveObserve is what the adaptive total adds to a request
// besides its writer wrapper: two clock reads and one sample given to the
// controller (a window closing every 250 ms among them).
func BenchmarkAdaptiveObserve(b *testing.B) {
	a := NewAdaptive(AdaptiveConfig{Min: 1, Max: 1000, Initial: 4, Tolerance: 0.2, Window: 250 * time.Millisecond}, time.Now())
	b.ReportAllocs()
	for b.Loop() {
		admitted := time.Now()
		a.Observe(time.Now(), admitted, http.StatusOK, 2)
	}
}

// grantAll is a ledger that grants every want at once, with no round
// trip: what the zone itself costs a request that needs the fleet.
type grantAll struct{ changed chan struct{} }

func (g grantAll) Ask(c *fleet.Call) error {
	for i := range c.Wants {
		w := &c.Wants[i]
		w.Levels, w.Granted = make([]int64, len(w.Sets)), make([]int64, len(w.Sets))
	}
	return nil
}
func (g grantAll) Changed() <-chan struct{} { return g.changed }
func (grantAll) Tight(string) bool          { return false }
func (grantAll) Lease() time.Duration       { return 30 * time.Second }
func (grantAll) Epoch() uint64              { return 0 }
func (grantAll) FailOpen() bool             { return true }

// BenchmarkFleetColdKeys is admit + release of requests each of a key of
// its own, from every CPU, in a zone on a ledger that grants at once:
// each admission asks the fleet (a key with no allowance), each release
// writes it back. It measures the zone's side of the million-key run
// (docs/performance.md) without Redis or the network.
func BenchmarkFleetColdKeys(b *testing.B) {
	z := NewZone(1, false, nil)
	z.SetLedger(grantAll{make(chan struct{})})
	b.Cleanup(z.Close)
	lim := &Limits{Max: []int64{1 << 30}}
	var next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		r := &Request{Keys: []string{""}, Max: []int64{0}, Limits: lim}
		ctx := context.Background()
		for pb.Next() {
			r.Keys[0] = "k" + strconv.FormatInt(next.Add(1), 10)
			if res := z.Acquire(ctx, r, WaitOptions{}); res.Outcome != Admitted {
				b.Fatalf("refused: %+v", res)
			}
			r.slot.Release()
		}
	})
}
