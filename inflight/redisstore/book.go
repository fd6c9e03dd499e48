package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-inflight/caddy-inflight/inflight"
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// redisBooks holds one book per Redis configuration, shared by every
// handler and config generation that uses it, so leases held across a
// reload keep being renewed.
var redisBooks = caddy.NewUsagePool()

// redisBook is the client for one Redis setup, and this instance's record of
// the leases it holds there.
//
// Invariants: leases lists exactly the leases this instance was granted and
// has not released; the renewal timer extends each of them every lease/3,
// so a lease held by a live instance never expires, and one of a dead
// instance expires at most `lease` after its last renewal.
type redisBook struct {
	client   redis.UniversalClient
	logger   *zap.Logger
	lease    time.Duration
	timeout  time.Duration
	prefix   string
	instance string // random, so members from different instances differ

	next   atomic.Uint64
	mu     sync.Mutex
	leases map[string][]string // member -> the sorted sets it is in
	zones  map[string]*redisZone

	down    atomic.Int64 // unix nanos until which Redis counts as unreachable
	stop    chan struct{}
	stopped sync.WaitGroup
}

func newRedisBook(s *Store, logger *zap.Logger) *redisBook {
	timeout := time.Duration(s.Timeout)
	b := &redisBook{
		client: redis.NewUniversalClient(&redis.UniversalOptions{
			Addrs:        s.Address,
			MasterName:   s.MasterName,
			Username:     s.Username,
			Password:     s.Password,
			DB:           s.DB,
			DialTimeout:  timeout,
			ReadTimeout:  timeout,
			WriteTimeout: timeout,
			PoolTimeout:  timeout,
			MaxRetries:   -1, // a retry would double the wait; the caller falls back instead
		}),
		logger:   logger,
		lease:    time.Duration(s.Lease),
		timeout:  timeout,
		prefix:   s.KeyPrefix,
		instance: randomID(),
		leases:   map[string][]string{},
		zones:    map[string]*redisZone{},
		stop:     make(chan struct{}),
	}
	b.stopped.Add(2)
	go b.renewLoop()
	go b.listen()
	return b
}

// Destruct stops the timer and the subscription and closes the client.
// Leases still held expire by themselves.
func (b *redisBook) Destruct() error {
	close(b.stop)
	err := b.client.Close()
	b.stopped.Wait()
	return err
}

// zone returns the store of one zone, made on first use and kept across
// reloads (with its waiters); id names the zone and its shape, so the
// whole fleet uses the same keys for the same limits.
func (b *redisBook) zone(id string, limits []string, hasTotal bool, local *limiter.Zone, closed bool) *redisZone {
	b.mu.Lock()
	defer b.mu.Unlock()
	// The braces are a Redis Cluster hash tag: all of a zone's keys live in
	// one slot, as the admission script needs.
	tag := b.prefix + ":{" + id + "}"
	z := b.zones[tag]
	if z == nil {
		z = newRedisZone(b, tag, limits, hasTotal, local)
		b.zones[tag] = z
	}
	z.closed.Store(closed)
	return z
}

// member returns a new lease identifier.
func (b *redisBook) member() string {
	return b.instance + ":" + strconv.FormatUint(b.next.Add(1), 36)
}

func (b *redisBook) track(member string, keys []string) {
	b.mu.Lock()
	b.leases[member] = keys
	b.mu.Unlock()
}

func (b *redisBook) untrack(member string) {
	b.mu.Lock()
	delete(b.leases, member)
	b.mu.Unlock()
}

// renewLoop extends every lease held, in one pipeline per tick.
func (b *redisBook) renewLoop() {
	defer b.stopped.Done()
	tick := time.NewTicker(b.lease / 3)
	defer tick.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-tick.C:
		}
		// One script per zone (a cluster slot), all in one pipeline.
		b.mu.Lock()
		byZone := map[string][]any{} // zone -> sets and members, interleaved
		for m, keys := range b.leases {
			for _, k := range keys {
				tag := k[:strings.IndexByte(k, '}')+1]
				byZone[tag] = append(byZone[tag], k, m)
			}
		}
		b.mu.Unlock()
		if len(byZone) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
		start := time.Now()
		_, err := b.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, pairs := range byZone {
				keys := make([]string, 0, len(pairs)/2)
				args := []any{b.lease.Milliseconds()}
				for i := 0; i < len(pairs); i += 2 {
					keys = append(keys, pairs[i].(string))
					args = append(args, pairs[i+1])
				}
				p.Eval(ctx, renewScript, keys, args...)
			}
			return nil
		})
		cancel()
		b.observe("renew", start, err)
	}
}

// renewScript extends leases by the lease from Redis's own clock. KEYS:
// the sets; ARGV: the lease (ms), then the member in each set.
const renewScript = `
local t = redis.call('TIME')
local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
	redis.call('ZADD', key, 'XX', expiry, ARGV[i + 1])
	redis.call('PEXPIRE', key, 2 * tonumber(ARGV[1]))
end
return 0
`

// listen wakes a zone's waiters when any instance releases one of its
// slots.
func (b *redisBook) listen() {
	defer b.stopped.Done()
	pubsub := b.client.PSubscribe(context.Background(), b.prefix+":{*}:released")
	defer pubsub.Close()
	messages := pubsub.Channel()
	for {
		select {
		case <-b.stop:
			return
		case m, ok := <-messages:
			if !ok {
				return
			}
			b.mu.Lock()
			z := b.zones[strings.TrimSuffix(m.Channel, ":released")]
			b.mu.Unlock()
			if z != nil {
				z.wake()
			}
		}
	}
}

// available reports whether Redis is worth trying: after a failure it is
// left alone for a second, so requests do not each wait out a timeout.
func (b *redisBook) available() bool {
	return time.Now().UnixNano() >= b.down.Load()
}

// observe records an operation's latency and outcome, and logs when Redis
// becomes unreachable and reachable again.
func (b *redisBook) observe(op string, start time.Time, err error) {
	failed := err != nil && err != redis.Nil
	inflight.ObserveStore("redis", op, time.Since(start), failed)
	if !failed {
		if b.down.Swap(0) != 0 {
			b.logger.Info("redis store reachable again")
		}
		return
	}
	if b.down.Swap(time.Now().Add(time.Second).UnixNano()) == 0 {
		b.logger.Error("redis store unreachable", zap.String("op", op), zap.Error(err))
	}
}

func randomID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
