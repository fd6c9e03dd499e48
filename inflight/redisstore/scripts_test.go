package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/fleet"
	"github.com/caddy-inflight/caddy-inflight/inflight/internal/fleetref"
)

// TestCallScriptMatchesReference drives the call script in a real Redis
// and the reference rules (internal/fleetref) with the same calls, from
// three instances on a handful of sets, and compares every answer: each
// want's verdict, levels and spare, the tables, the notices, and a stale
// call. The calls are random: writes, reports (new, renewed, withdrawn),
// wants of one to three sets with holds, spares and waiting, calls sent
// again, versions that go back; with a lease and a report's life of a few tens
// of milliseconds, so allowances and reports expire between calls. Each
// call is applied to the reference at the time Redis read for it.
func TestCallScriptMatchesReference(t *testing.T) {
	addr, cli := startRedis(t)
	_ = addr
	ctx := context.Background()
	for seed := range 40 {
		rng := rand.New(rand.NewPCG(uint64(seed), 39))
		tag := fmt.Sprintf("ref:%s:{z%d}", keySchema, seed)
		sub := cli.Subscribe(ctx, tag+":n")
		if _, err := sub.Receive(ctx); err != nil { // subscribed
			t.Fatal(err)
		}
		ref := fleetref.New()
		insts := []string{"i0", "i1", "i2"}
		versions := map[string]int64{}
		sets := []string{"t", "0:a", "0:b", "1:c"}
		lease, reportLife := int64(30+rng.IntN(60)), int64(20+rng.IntN(60))
		for step := range 60 {
			inst := insts[rng.IntN(len(insts))]
			versions[inst]++
			version := versions[inst]
			if rng.IntN(20) == 0 { // a late script: older than its instance's last
				version -= int64(1 + rng.IntN(3))
			}
			c := randomCall(rng, sets)
			twin := cloneCall(c)
			l := &ledger{book: &book{lease: time.Duration(lease) * time.Millisecond, instance: inst}, tag: tag}
			keys, args := l.encode(c, callHeader{1 << 62, lease, reportLife, version})
			reply, err := callScript.Run(ctx, cli, keys, args).Slice()
			if err != nil {
				t.Fatalf("seed %d step %d: %v", seed, step, err)
			}
			now := reply[0].(int64)*1000 + reply[1].(int64)/1000
			notices, stale := ref.Apply(now, fleetref.Caller{Instance: inst, Version: version, Lease: lease, ReportLife: reportLife}, twin)
			got := l.decode(c, keys, reply)
			if stale != (got == errStale) {
				t.Fatalf("seed %d step %d: stale %v in Redis, %v in the reference", seed, step, got == errStale, stale)
			}
			if got != nil && got != errStale {
				t.Fatalf("seed %d step %d: %v", seed, step, got)
			}
			if !stale && !reflect.DeepEqual(answers(c), answers(twin)) {
				t.Fatalf("seed %d step %d, call %+v:\nRedis     %+v\nreference %+v", seed, step, twin, answers(c), answers(twin))
			}
			for _, want := range notices {
				heard, cancel := context.WithTimeout(ctx, time.Second) // a notice not published fails, not hangs
				msg, err := sub.ReceiveMessage(heard)
				cancel()
				if err != nil {
					t.Fatalf("seed %d step %d: notice %q not heard: %v", seed, step, want, err)
				}
				if msg.Payload != want {
					t.Fatalf("seed %d step %d: notice %q, want %q", seed, step, msg.Payload, want)
				}
			}
			time.Sleep(time.Duration(rng.IntN(15)) * time.Millisecond)
		}
		sub.Close()
		// Nothing published beyond what the reference did: a sentinel
		// notice is the next one heard.
		sub = cli.Subscribe(ctx, tag+":n")
		sub.Receive(ctx)
		cli.Publish(ctx, tag+":n", "end")
		if msg, err := sub.ReceiveMessage(ctx); err != nil || msg.Payload != "end" {
			t.Fatalf("seed %d: after the calls, %v %v", seed, msg, err)
		}
		sub.Close()
	}
}

// answers is what a call was answered: each want's verdict, levels and
// spares, and the tables.
func answers(c *fleet.Call) string {
	var b strings.Builder
	for _, w := range c.Wants {
		fmt.Fprintf(&b, "want refused %d levels %v granted %v\n", w.Refused, w.Levels, w.Granted)
	}
	for _, t := range c.Tables {
		fmt.Fprintf(&b, "table %s %+v\n", t.Set, t.Members)
	}
	return b.String()
}

// randomCall returns a call of random writes, reports and wants on sets.
func randomCall(rng *rand.Rand, sets []string) *fleet.Call {
	c := &fleet.Call{Again: rng.IntN(10) == 0}
	pick := func() string { return sets[rng.IntN(len(sets))] }
	for range rng.IntN(3) {
		c.Writes = append(c.Writes, fleet.Write{Set: pick(), Units: int64(rng.IntN(4)), Spare: int64(rng.IntN(2))})
	}
	for range rng.IntN(3) {
		head := int64(rng.IntN(4))
		r := fleet.Report{Set: pick(), New: rng.IntN(3) == 0, Head: head, Need: rng.Int64N(head + 1),
			Target: float64(rng.IntN(80)) / 10, Entries: fmt.Sprintf("k%d 1 %d;- 2 2", rng.IntN(3), rng.IntN(5))}
		c.Reports = append(c.Reports, r)
	}
	for range rng.IntN(4) {
		w := fleet.Want{Waits: rng.IntN(2) == 0}
		for _, set := range rng.Perm(len(sets))[:1+rng.IntN(3)] {
			w.Sets = append(w.Sets, sets[set])
			w.Caps = append(w.Caps, int64(1+rng.IntN(12)))
			w.Units = append(w.Units, int64(1+rng.IntN(3)))
			w.Spares = append(w.Spares, int64(rng.IntN(3)*rng.IntN(4)))
			w.Holds = append(w.Holds, rng.IntN(3) == 0)
			w.Allowance = append(w.Allowance, int64(rng.IntN(4)))
			w.AllowanceSpare = append(w.AllowanceSpare, int64(rng.IntN(2)))
		}
		c.Wants = append(c.Wants, w)
	}
	return c
}

// cloneCall copies c deeply enough for the reference to answer it apart.
func cloneCall(c *fleet.Call) *fleet.Call {
	out := *c
	out.Wants = make([]fleet.Want, len(c.Wants))
	copy(out.Wants, c.Wants)
	return &out
}
