package limiter

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

func TestDbgOcc(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newRefFleet(); debugFleet = true; defer func() { debugFleet = false }()
		f.latency = 100 * time.Millisecond
		zones := fleetZones(t, f, 3, 1, false)
		lim := &Limits{Max: []int64{6}}
		var tenants []fleetTenant
		for i := range 1 {
			tenants = append(tenants, fleetTenant{weight: 1, clients: 12, home: i, hold: between(50*time.Millisecond, 300*time.Millisecond)})
		}
		go func() {
			for i := 0; i < 40; i++ {
				time.Sleep(250 * time.Millisecond)
				var s string
				for _, z := range zones {
					z.mu.Lock()
					set := Set{Dim: 0, Hash: z.hash(&Request{Keys: []string{"tenant0"}}, 0)}
					a := z.stateOf(set)
					tg, ok := z.targetOf(set)
					var raw, owed float64
					if tt := z.asks.targets[set]; tt != nil { raw, owed = tt.units, tt.owed }
					s += fmt.Sprintf(" [fl %d al %d w %d t %v/%d %.2f %.2f]", a.inFlight, a.units, z.Waiting(), ok, tg, raw, owed)
					z.mu.Unlock()
				}
				fmt.Println(time.Now().Format("05.000"), s)
			}
		}()
		run := runFleet(t, zones, lim, false, 1.0/3, tenants, 2*time.Second, 8*time.Second)
		t.Logf("the fleet held %.2f of 6 on average, %d at most", run.mean, run.peak)
	})
}
