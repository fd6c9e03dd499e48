package core

import (
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddyserver/caddy/v2"
)

func TestDeadlineWait(t *testing.T) {
	for _, c := range []struct{ wait, left, want time.Duration }{
		{10 * time.Second, 300 * time.Millisecond, 270 * time.Millisecond}, // 10 %
		{10 * time.Second, 2 * time.Second, 1950 * time.Millisecond},       // 50 ms at most
		{time.Second, 5 * time.Second, time.Second},                        // the wait is shorter
		{time.Second, 0, 0},
		{time.Second, -time.Second, 0}, // already past
		{time.Second, time.Duration(math.MaxInt64), time.Second},
	} {
		if got := DeadlineWait(c.wait, c.left); got != c.want {
			t.Errorf("DeadlineWait(%s, %s) = %s, want %s", c.wait, c.left, got, c.want)
		}
	}
}

// The grant rate, in virtual time: it predicts nothing before minGrants
// releases, reads a steady rate within 5 % once it has counted for 3 τ
// (and within 20 % from the start, thanks to its correction), and falls
// while nothing is released.
func TestGrantRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var g grantRate
		if _, ok := g.rate(time.Now()); ok {
			t.Fatal("a rate with no release")
		}
		for range minGrants - 1 {
			time.Sleep(100 * time.Millisecond)
			g.add(time.Now())
		}
		if _, ok := g.expectedWait(5, time.Now()); ok {
			t.Fatal("a prediction before minGrants releases")
		}
		for i := range 100 { // 10/s for 10 s
			time.Sleep(100 * time.Millisecond)
			g.add(time.Now())
			if i == 10 {
				if r, _ := g.rate(time.Now()); math.Abs(r-10) > 2 {
					t.Fatalf("after 1.4 s at 10/s: %.2f/s", r)
				}
			}
		}
		r, ok := g.rate(time.Now())
		if !ok || math.Abs(r-10) > 0.5 {
			t.Fatalf("steady 10/s read as %.2f/s", r)
		}
		if w, _ := g.expectedWait(19, time.Now()); w < 1900*time.Millisecond || w > 2100*time.Millisecond {
			t.Fatalf("20th in line expects %s, want about 2s", w)
		}
		time.Sleep(3 * grantTau) // nothing freed: the rate falls e^-3
		if r2, _ := g.rate(time.Now()); r2 > r*0.06 {
			t.Fatalf("after 3 τ without a release: %.2f/s", r2)
		}
	})
}

// deadlineOpt bounds the wait and, with early refusal, refuses exactly
// when the zone's rate says the queue ahead will not be served in time.
func TestDeadlineOpt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := testGateOn(t, "deadline-opt", &Config{Total: 2, Wait: caddy.Duration(10 * time.Second)}, Edge{EarlyRefusal: true})
		opt := g.waitOpt
		g.deadlineOpt(&opt, 300*time.Millisecond)
		if opt.Wait != 270*time.Millisecond || opt.Refuse == nil {
			t.Fatalf("wait %s, Refuse set %v; want 270ms and set", opt.Wait, opt.Refuse != nil)
		}
		if opt.Refuse(100) {
			t.Fatal("refused early with no rate known")
		}
		for range 20 { // 10 grants/s for 2 s
			time.Sleep(100 * time.Millisecond)
			g.zone.grants.add(time.Now())
		}
		// 270 ms at ~10/s: up to 2 ahead pass, 3 and more do not.
		if opt.Refuse(1) {
			t.Error("refused with 1 ahead (0.2 s expected)")
		}
		if !opt.Refuse(3) {
			t.Error("admitted to wait with 3 ahead (0.4 s expected)")
		}
		none := g.waitOpt
		g.deadlineOpt(&none, 20*time.Millisecond) // nothing left beyond the margin? 18 ms
		if none.Wait != 18*time.Millisecond {
			t.Fatalf("wait %s, want 18ms", none.Wait)
		}
		past := g.waitOpt
		g.deadlineOpt(&past, 0)
		if past.Wait != 0 || past.Refuse != nil {
			t.Fatalf("no time left: wait %s, Refuse set %v; want 0, unset (refused at once if it does not fit)", past.Wait, past.Refuse != nil)
		}
		off := testGateOn(t, "deadline-opt-off", &Config{Total: 2, Wait: caddy.Duration(10 * time.Second)}, Edge{})
		o := off.waitOpt
		off.deadlineOpt(&o, time.Second)
		if o.Refuse != nil || o.Wait != 950*time.Millisecond {
			t.Fatalf("without early refusal: wait %s, Refuse set %v", o.Wait, o.Refuse != nil)
		}
	})
}

// TestEarlyRefusalMargin pins early refusal's rule: a unit with queued
// units ahead is refused at once exactly when (queued + 1) / the zone's
// rate is over 1.25 × the wait its deadline leaves it, at a steady
// 10 grants/s and a 270 ms wait: 3 in line (300 ms) still wait, above the
// wait but within its margin; 4 (400 ms, over 337.5) are refused.
func TestEarlyRefusalMargin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := testGateOn(t, "early-margin", &Config{Total: 2, Wait: caddy.Duration(10 * time.Second)}, Edge{EarlyRefusal: true})
		opt := g.waitOpt
		g.deadlineOpt(&opt, 300*time.Millisecond) // a 270 ms wait
		for range 100 {                           // 10/s for 10 s: the rate within 5 %
			time.Sleep(100 * time.Millisecond)
			g.zone.grants.add(time.Now())
		}
		r, _ := g.zone.grants.rate(time.Now())
		for queued := range int64(8) {
			expected := float64(queued+1) / r
			want := expected > 1.25*opt.Wait.Seconds()
			if got := opt.Refuse(queued); got != want {
				t.Errorf("%d ahead at %.2f/s (%.0f ms expected, wait 270 ms): refused %v, want %v", queued, r, expected*1000, got, want)
			}
		}
		if opt.Refuse(2) || !opt.Refuse(3) {
			t.Errorf("at %.2f/s: 2 ahead refused %v, 3 ahead %v; want waiting, refused", r, opt.Refuse(2), opt.Refuse(3))
		}
	})
}
