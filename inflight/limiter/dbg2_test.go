package limiter

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

func TestDbgFair(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newRefFleet()
		zones := fleetZones(t, f, 3, 1, true)
		lim := &Limits{Max: []int64{1000}, Total: 12}
		var tenants []fleetTenant
		for i := range 3 {
			tenants = append(tenants, fleetTenant{weight: float64(3-i), cost: 2, clients: 8, home: i, hold: between(100*time.Millisecond, 300*time.Millisecond)})
		}
		go func() {
			for i := 0; i < 800; i++ {
				time.Sleep(50 * time.Millisecond)
				var s string
				tot := int64(0)
				for _, z := range zones {
					z.mu.Lock()
					set := Set{Dim: TotalDim}
					a := z.stateOf(set)
					tot += a.inFlight
					tg, ok := z.targetOf(set)
					var raw, owed float64
					var others bool
					if tt := z.asks.targets[set]; tt != nil { raw, owed, others = tt.units, tt.owed, tt.others }
					if a.idle() > 0 && z.Waiting() > 0 {
						for _, w := range z.order(time.Now()) {
							if w == w.flow.head {
								o, d := z.tryAcquire(w.req, nil)
								if o == Admitted { z.giveBack(w.req, false) }
								fmt.Println("   stuck head", w.req.Keys, "asks", w.flow.asks, "turned", !w.flow.turned.IsZero(), "try", o, d, "pending", z.pending.Load())
							}
						}
					}
					s += fmt.Sprintf(" [fl %d al %d w %d t %v/%d %.2f %.2f %v]", a.inFlight, a.units, z.Waiting(), ok, tg, raw, owed, others)
					z.mu.Unlock()
				}
				fmt.Println(time.Now().Format("05.000"), tot, s)
			}
		}()
		runFleet(t, zones, lim, true, 0.8, tenants, 1*time.Second, 39*time.Second)
	})
}
