package limiter

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// BenchmarkDrain queues 10,000 waiters behind a total of 10, then lets them
// through: each admitted waiter releases at once. The waiters share one
// key, or have 1,000 or 10,000 keys (a flood from as many client
// addresses); with fair, they share by key. A release serves the best
// waiting flow without trying the others, so the drain takes about as long
// whatever the number of keys (one op: the whole drain).
func BenchmarkDrain(b *testing.B) {
	const waiters = 10_000
	for _, fair := range []bool{false, true} {
		for _, keys := range []int{1, 1000, 10_000} {
			b.Run(fmt.Sprintf("fair=%v/keys=%d", fair, keys), func(b *testing.B) {
				names := benchKeys(keys)
				for b.Loop() {
					drain(b, names, waiters, fair)
				}
			})
		}
	}
}

// drain runs one drain: see BenchmarkDrain.
func drain(b *testing.B, keys []string, waiters int, fair bool) {
	b.StopTimer()
	z := NewZone(1, true, nil)
	lim := &Limits{Max: []int64{1 << 30}, Total: 10}
	holders := make([]*Request, 10)
	for i := range holders {
		holders[i] = &Request{Keys: []string{"holder"}, Max: []int64{0}, Limits: lim}
		if slot, _ := z.TryAcquire(holders[i]); slot == nil {
			b.Fatal("holder refused")
		}
	}
	opt := WaitOptions{Wait: time.Hour, Fair: fair}
	var wg sync.WaitGroup
	for i := range waiters {
		r := &Request{Keys: []string{keys[i%len(keys)]}, Max: []int64{0}, Limits: lim}
		wg.Go(func() {
			if z.Acquire(context.Background(), r, opt).Outcome != Admitted {
				b.Error("waiter not admitted")
				return
			}
			r.slot.Release()
		})
	}
	for waitingIn(z) < int64(waiters) {
		time.Sleep(time.Millisecond)
	}
	b.StartTimer()
	for _, r := range holders {
		r.slot.Release()
	}
	wg.Wait()
}
