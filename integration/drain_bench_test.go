package integration

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// BenchmarkDrainThroughCaddy is the engine's BenchmarkDrain end to end: 10
// requests hold a total of 10, 8,000 more wait (one key, or 8,000 keys: a
// flood from as many clients; 8,000 because client and server share this
// process's 20,000 file descriptors), then the holders end and the waiters
// drain through Caddy, each answered at once by the backend. One op: the
// drain, from the gate opening to the last response. Run with
// -benchtime 1x; compare keys=1 with keys=8000.
func BenchmarkDrainThroughCaddy(b *testing.B) {
	const waiters = 8_000
	for _, keys := range []int{1, waiters} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			b.StopTimer()
			for range b.N {
				drainThroughCaddy(b, keys, waiters)
			}
		})
	}
}

func drainThroughCaddy(b *testing.B, keys, waiters int) {
	t := testing.TB(b)
	be := newBackend(t)
	port := freePort(b)
	load(t, fmt.Sprintf(`http://127.0.0.1:%d {
	inflight {
		limit client {header.X-Client} 100000
		total 10
		zone drain
		wait 120s
		max_waiting %d
	}
	reverse_proxy %s
}
`, port, waiters, be.addr))
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: waiters, DisableCompression: true}, Timeout: 300 * time.Second}
	var held []<-chan result
	for i := range 10 {
		held = append(held, hold(t, be, context.Background(), c, url+"/hold", "X-Client", "holder"+strconv.Itoa(i)))
	}
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Go(func() {
			if r := get(context.Background(), c, url+"/", "X-Client", strconv.Itoa(i%keys)); r.status != 200 {
				b.Errorf("waiter: %d %v", r.status, r.err)
			}
		})
	}
	eventually(b, "every waiter queued", func() bool { return metric(t, "caddy_inflight_waiting", `zone="drain"`) == float64(waiters) })
	b.StartTimer()
	be.open()
	wg.Wait()
	b.StopTimer()
	for _, h := range held {
		<-h
	}
}
