package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Every script that writes leases carries a deadline: the Redis time after
// which its caller has given up on it. A script that waited in Redis's
// socket longer (a stalled or stopped Redis) writes nothing, so the leases
// it would have written cannot outlive the book's removal of them as
// ghosts, however long the stall.
//
// The deadline is computed in Redis's clock, not this instance's, from
// what the zone's earlier replies said: each carries Redis's TIME, read
// between the call's sending and its reply. That bounds Redis's clock
// minus this instance's monotonic clock from below (time read + time of
// reply) and from above (time read + time of sending); the book keeps the
// tightest lower bound, so a deadline is never later in Redis than the
// caller's own. A reply whose upper bound falls below it means Redis's
// clock went back, or another server answers (a failover): the bound
// starts again from that reply.

// epoch anchors this instance's monotonic clock.
var epoch = time.Now()

// localMicros reads this instance's monotonic clock, in microseconds.
func localMicros() int64 { return time.Since(epoch).Microseconds() }

// redisClock is what the book knows of one zone's Redis clock.
type redisClock struct {
	known bool
	lo    int64 // Redis's TIME minus localMicros, in µs: a lower bound
}

// learn narrows the clock with a reply: Redis read its TIME, redisNow
// (µs), between sent and received (localMicros).
func (c *redisClock) learn(redisNow, sent, received int64) {
	lo, hi := redisNow-received, redisNow-sent
	if !c.known || hi < c.lo {
		c.known, c.lo = true, lo
		return
	}
	c.lo = max(c.lo, lo)
}

// deadline returns the Redis time (µs) after which a call whose own
// deadline is localDeadline (localMicros) must not write.
func (c *redisClock) deadline(localDeadline int64) int64 { return c.lo + localDeadline }

// lateError is the error reply of a script that ran after its deadline;
// it carries Redis's TIME.
const lateError = "LATE"

// errLate is how a call whose script ran after its deadline failed.
var errLate = errors.New("redis ran the script after its deadline (timeout): it was held up, and wrote nothing")

// replyTime returns the Redis time (µs) a script's reply carries: its
// first two elements, or the time in a late error.
func replyTime(reply []int64, err error) (int64, bool) {
	if err == nil && len(reply) >= 2 {
		return reply[0]*1e6 + reply[1], true
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return 0, false
	}
	f := strings.Fields(rerr.Error())
	if len(f) != 3 || f[0] != lateError {
		return 0, false
	}
	sec, err1 := strconv.ParseInt(f[1], 10, 64)
	usec, err2 := strconv.ParseInt(f[2], 10, 64)
	return sec*1e6 + usec, err1 == nil && err2 == nil
}

// asLate turns a script's late error reply into errLate.
func asLate(err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), lateError+" ") {
		return errLate
	}
	return err
}

// learnClock narrows the zone's clock with a reply sent at sent.
func (b *book) learnClock(tag string, reply []int64, err error, sent int64) {
	now, ok := replyTime(reply, err)
	if !ok {
		return
	}
	received := localMicros()
	b.mu.Lock()
	c := b.clocks[tag]
	if c == nil {
		c = new(redisClock)
		b.clocks[tag] = c
	}
	c.learn(now, sent, received)
	b.mu.Unlock()
}

// deadline returns the Redis time (µs) after which a script of the zone,
// sent within ctx (whose deadline is localDeadline), must not write. If no
// reply has told the zone's clock yet, it asks Redis's TIME first.
func (b *book) deadline(ctx context.Context, tag string, localDeadline int64) (int64, error) {
	if !b.knowsClock(tag) {
		// One call asks, the others wait for its answer: a burst of
		// requests in a new zone does not take twice the connections.
		b.asking.Lock()
		if !b.knowsClock(tag) {
			sent := localMicros()
			reply, err := timeScript.Run(ctx, b.client, []string{tag + ":~seq"}).Int64Slice()
			if err != nil {
				b.asking.Unlock()
				return 0, err
			}
			b.learnClock(tag, reply, nil, sent)
		}
		b.asking.Unlock()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.clocks[tag].deadline(localDeadline), nil
}

func (b *book) knowsClock(tag string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.clocks[tag] != nil
}
