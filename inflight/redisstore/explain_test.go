package redisstore

import (
	"context"
	"fmt"
	"testing"

	"go.uber.org/zap"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// Every rise of caddy_inflight_store_errors_total (op="release" included)
// has a log line to explain it, naming the zone: an outage is logged once,
// by the operation that found it, and the first failure of each operation
// in an outage is logged, naming its zones and the reason.
func TestEveryFailedOperationIsExplained(t *testing.T) {
	addr, cli := startRedis(t)
	p := newFaultProxy(t, addr)
	// The default timeout (2 s): the proxy drops connections at once, and a
	// shorter one timed calls out under load before the outage began.
	s := newStore(t, store(p.addr, nil))
	logs := observeLogs(s.book)
	limits := &limiter.Limits{Max: []int64{5}}
	z := zoneOf(t, s, "billing/0123abcd", limits)
	warmUp(t, z, limits, cli)
	held := mustAdmit(t, z, request(limits, "k"), "acquire")

	p.setDown(true)
	z.Acquire(context.Background(), request(limits, "k"), limiter.WaitOptions{}) // the outage starts: logged
	held.Release()                                                               // its Redis side fails too
	eventually(t, "the failed release logged", func() bool {
		return logs.FilterMessage("redis store operation failed").FilterField(zap.String("op", "release")).Len() == 1
	})
	for _, e := range append(logs.FilterMessage("redis store unreachable").All(), logs.FilterMessage("redis store operation failed").All()...) {
		m := e.ContextMap()
		if fmt.Sprint(m["zones"]) != "[billing]" || m["reason"] == nil {
			t.Errorf("%s (op %v): zones %v, reason %v; want zones [billing] and a reason", e.Message, m["op"], m["zones"], m["reason"])
		}
	}
	if n := logs.FilterMessage("redis store unreachable").Len(); n != 1 {
		t.Errorf("the outage logged as unreachable %d times, want once", n)
	}
}
