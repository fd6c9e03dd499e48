package redisstore

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// BenchmarkAcquireRelease is the cost of one request through the store on
// loopback: the admission script's round trip, and a release (whose Redis
// side is batched off the request's path).
func BenchmarkAcquireRelease(b *testing.B) {
	addr, _ := startRedis(b)
	s := newStore(b, store(addr, nil))
	limits := &limiter.Limits{Max: []int64{1 << 30}, Total: 1 << 30}
	z, _ := zoneOf(s, "bench", limits)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := request(limits, "k")
		for pb.Next() {
			if res := z.Acquire(context.Background(), req, limiter.WaitOptions{}); res.Outcome != limiter.Admitted {
				b.Fatalf("acquire: %v", res.Outcome)
			}
			z.Release(req)
		}
	})
}

// BenchmarkReleaseWithRedisDelayed measures what the store adds to the end
// of a response: the time Release takes, with Redis's replies delayed by a
// proxy, as p99 over b.N requests (run with -benchtime=200x or so).
func BenchmarkReleaseWithRedisDelayed(b *testing.B) {
	for _, delay := range []time.Duration{0, 200 * time.Millisecond} {
		b.Run(fmt.Sprint("delay=", delay), func(b *testing.B) {
			addr, cli := startRedis(b)
			p := newFaultProxy(b, addr)
			s := newStore(b, store(p.addr, func(s *Store) { s.Timeout = caddy.Duration(time.Second) }))
			limits := &limiter.Limits{Max: []int64{1 << 30}}
			z, _ := zoneOf(s, "delayed", limits)
			p.setDelay(delay)
			took := make([]time.Duration, 0, b.N)
			for b.Loop() {
				req := request(limits, "k")
				if res := z.Acquire(context.Background(), req, limiter.WaitOptions{}); res.Outcome != limiter.Admitted {
					b.Fatalf("acquire: %v", res.Outcome)
				}
				start := time.Now()
				z.Release(req)
				took = append(took, time.Since(start))
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "release-p99-µs")
			p.setDelay(0)
			eventually(b, "every lease removed", func() bool { return members(b, cli, "t") == 0 })
		})
	}
}

// BenchmarkRedisCPUPerAdmission admits and releases from 16 goroutines
// through one zone, and reports what Redis spent on each request, from
// INFO commandstats: the scripts' calls and time (µs, the commands they
// ran included) and the ZREMs. plain: no fair; keys64: each request on
// the next of 64 keys (most find their set empty: zone-throughput.sh's
// 64-key run); fair: fair over the one key, none waiting; fair-contended:
// fair over 4 keys sharing a total of 8, half of the requests waiting.
func BenchmarkRedisCPUPerAdmission(b *testing.B) {
	for _, bc := range []struct {
		name  string
		fair  bool
		keys  int
		each  bool // a key for each request, not each goroutine
		total int64
	}{{"plain", false, 1, false, 1 << 30}, {"keys64", false, 64, true, 1 << 30}, {"fair", true, 1, false, 1 << 30}, {"fair-contended", true, 4, false, 8}} {
		b.Run(bc.name, func(b *testing.B) {
			addr, cli := startRedis(b)
			s := newStore(b, store(addr, nil))
			limits := &limiter.Limits{Max: []int64{1 << 30}, Total: bc.total}
			z, _ := zoneOf(s, "cpu", limits)
			cli.ConfigResetStat(context.Background())
			var next atomic.Int64
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				req := request(limits, fmt.Sprint("k", next.Add(1)%int64(bc.keys)))
				opt := limiter.WaitOptions{Wait: time.Minute, Fair: bc.fair}
				for pb.Next() {
					if bc.each {
						req = request(limits, fmt.Sprint("k", next.Add(1)%int64(bc.keys)))
					}
					if res := z.Acquire(context.Background(), req, opt); res.Outcome != limiter.Admitted {
						b.Fatalf("acquire: %v", res.Outcome)
					}
					z.Release(req)
				}
			})
			b.StopTimer()
			// Before Redis stops: a removal still under way would log an outage.
			eventually(b, "every lease removed", func() bool { return nothingLeft(b, cli, "t") })
			stats := commandStats(b, cli)
			n := float64(b.N)
			b.ReportMetric(float64(stats["evalsha"].calls+stats["eval"].calls)/n, "scripts/op")
			b.ReportMetric((stats["evalsha"].usec+stats["eval"].usec)/n, "script-µs/op")
			b.ReportMetric(float64(stats["zrem"].calls)/n, "zrem/op")
		})
	}
}
