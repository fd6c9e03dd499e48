package redisstore

import (
	"context"
	"time"
)

// After a failure Redis is left alone for a second (available), so that
// requests do not each wait out a timeout: in on_error closed they are
// refused meanwhile, in open they use the local share. So that the
// instance rejoins as soon as Redis answers, not when the second is over,
// one goroutine per book probes it half-open meanwhile: a PING every
// probeEvery (or as soon as the last one timed out); the first answered
// ends the back-off and the outage (observe), which writes every lease
// back at once. A Redis that refuses connections costs a failed dial a
// probeEvery; one that does not answer, one PING in flight at a time.
const probeEvery = 10 * time.Millisecond

// backOff is how long Redis is left alone after a failure, unless the
// prober has an answer first.
const backOff = time.Second

// probe starts the prober if it is not running.
func (b *book) probe() {
	if b.probing.CompareAndSwap(false, true) {
		go b.probeUntilAnswered()
	}
}

// probeUntilAnswered pings Redis until it answers, the back-off ends
// otherwise (another call got an answer), or the book closes.
func (b *book) probeUntilAnswered() {
	defer b.probing.Store(false)
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	for b.downUntil.Load() != 0 {
		if !b.tryEnter() {
			return
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(storeContext, b.timeout)
		err := b.client.Ping(ctx).Err()
		cancel()
		if err == nil {
			b.observe("probe", nil, start, nil)
		}
		b.exit()
		<-tick.C
	}
}
