package redisstore

import (
	"strconv"
	"testing"

	"github.com/caddy-inflight/caddy-inflight/inflight/fleet"
)

// BenchmarkCallScriptColdKeys measures what a key used once costs Redis:
// calls of the shape a zone makes far from its caps under a million keys,
// each call asking one unit for each of perCall new keys and giving back
// the keys of the call before it. It reports Redis's time in the script
// per key (INFO commandstats), the figure docs/performance.md gives for
// the million-key run.
func BenchmarkCallScriptColdKeys(b *testing.B) {
	const perCall = 6
	addr, cli := startRedis(b)
	l := newStore(b, store(addr, nil)).book.ledger("cold")
	b.Cleanup(func() { l.Close() })
	var prev []string
	keys := 0
	call := func() {
		c := &fleet.Call{}
		for _, set := range prev {
			c.Writes = append(c.Writes, fleet.Write{Set: set})
		}
		prev = prev[:0]
		for range perCall {
			set := "0:" + strconv.Itoa(keys)
			keys++
			c.Wants = append(c.Wants, fleet.Want{Sets: []string{set}, Caps: []int64{1_000_000}, Units: []int64{1},
				Spares: []int64{0}, Holds: []bool{false}, Allowance: []int64{0}, AllowanceSpare: []int64{0}})
			prev = append(prev, set)
		}
		if err := l.Ask(c); err != nil {
			b.Fatal(err)
		}
		for _, w := range c.Wants {
			if w.Refused != 0 {
				b.Fatalf("a cold key refused: %+v", w)
			}
		}
	}
	call() // the script loaded, the clock learnt
	before, done := commandStats(b, cli), keys
	b.ResetTimer()
	for range b.N {
		call()
	}
	b.StopTimer()
	after := commandStats(b, cli)
	perKey := func(cmd string) float64 {
		return float64(after[cmd].calls-before[cmd].calls) / float64(keys-done)
	}
	b.ReportMetric((after["evalsha"].usec-before["evalsha"].usec)/float64(keys-done), "redis-µs/key")
	b.ReportMetric(perKey("hgetall")+perKey("hset")+perKey("pexpire")+perKey("del")+perKey("hdel")+perKey("hget"), "commands/key")
}
