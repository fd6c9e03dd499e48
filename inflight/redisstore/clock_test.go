package redisstore

import "testing"

// The deadline is never later in Redis's clock than the caller's own, and
// follows Redis's clock when it goes back or another server answers.
func TestClockBoundsRedisTime(t *testing.T) {
	var c redisClock
	// Redis is 1,000,000 µs ahead; the first reply took 100 µs.
	c.learn(1_000_050, 0, 100)
	if d := c.deadline(10_000); d > 1_010_000 {
		t.Fatalf("deadline %d, later than Redis's time at the caller's deadline (1010000)", d)
	}
	c.learn(1_000_510, 500, 520) // a faster reply: a tighter bound
	if d := c.deadline(10_000); d != 1_009_990 {
		t.Fatalf("deadline %d after a 20 µs reply, want 1009990", d)
	}
	c.learn(1_000_600, 600, 5_000) // a slow reply does not loosen it
	if d := c.deadline(10_000); d != 1_009_990 {
		t.Fatalf("deadline %d after a slow reply, want 1009990 still", d)
	}
	c.learn(500_700, 700, 710) // Redis's clock went back 500 ms (or a failover)
	if d := c.deadline(10_000); d > 510_000 {
		t.Fatalf("deadline %d after Redis's clock went back, want at most Redis's time at the caller's deadline (510000)", d)
	}
}
