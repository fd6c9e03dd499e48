package limiter

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/internal/fleetref"
)

var debugFleet = false

// refFleet is a fleet whose ledger is the reference (internal/fleetref),
// in memory, on the zones' clock (virtual under synctest): what Redis
// keeps, with notices delivered at once.
type refFleet struct {
	mu      sync.Mutex
	ref     *fleetref.Ledger
	members []*refMember
	lease   time.Duration
	fail    bool          // every Ask fails
	open    bool          // members fail open
	latency time.Duration // each call's round trip
}

// refMember is one instance's ledger on a refFleet.
type refMember struct {
	fleet   *refFleet
	id      string
	version int64
	changed chan struct{}
	tight   Tightness
	calls   int
}

func newRefFleet() *refFleet {
	return &refFleet{ref: fleetref.New(), lease: 30 * time.Second, open: true}
}

// join returns a new member's ledger.
func (f *refFleet) join() *refMember {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := &refMember{fleet: f, id: string(rune('a' + len(f.members))), changed: make(chan struct{}, 1)}
	f.members = append(f.members, m)
	return m
}

// held returns the units the fleet counts in set name (see setName).
func (f *refFleet) held(name string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var n int64
	for _, a := range f.ref.Apply(time.Now().UnixMilli(), fleetref.Call{Instance: "?", Reports: []fleetref.ReportIn{{Set: name, Head: 1}}, Listing: 1}).Tables[0].Allow {
		n += a.Units
	}
	return n
}

func (m *refMember) Ask(c *Call) error {
	f := m.fleet
	time.Sleep(f.latency / 2)
	defer time.Sleep(f.latency / 2)
	f.mu.Lock()
	defer f.mu.Unlock()
	m.calls++
	if f.fail {
		return errors.New("refFleet: no answer")
	}
	m.version++
	rc := fleetref.Call{Instance: m.id, Version: m.version, Lease: f.lease.Milliseconds(), Listing: Listing.Milliseconds()}
	for _, w := range c.Writes {
		rc.Writes = append(rc.Writes, fleetref.Write{Set: w.Set, Units: w.Units, Spare: w.Spare})
	}
	for _, r := range c.Reports {
		rc.Reports = append(rc.Reports, fleetref.ReportIn{Set: r.Set, New: r.New, Head: r.Head, Target: r.Target, Entries: r.Entries})
	}
	for _, w := range c.Wants {
		rc.Wants = append(rc.Wants, fleetref.Want{Sets: w.Sets, Caps: w.Caps, Units: w.Units, Spares: w.Spares, Waits: w.Waits, Holds: w.Holds})
	}
	now := time.Now()
	ans := f.ref.Apply(now.UnixMilli(), rc)
	if debugFleet {
		fmt.Printf("%s %s call %+v\n   -> refused %v levels %v tables %v notices %v\n", now.Format("05.000"), m.id, rc, ans.Refused, ans.Levels, ans.Tables, ans.Notices)
	}
	if ans.Stale {
		return errors.New("refFleet: stale call")
	}
	for i := range c.Wants {
		w := &c.Wants[i]
		w.Refused, w.Levels, w.Granted = ans.Refused[i], ans.Levels[i], ans.Spares[i]
	}
	for _, t := range ans.Tables {
		tb := Table{Set: t.Set}
		for _, inst := range t.Instances() {
			r, reports := t.Reports[inst]
			tb.Members = append(tb.Members, Member{Self: inst == m.id, Units: t.Allow[inst].Units,
				Reports: reports, Seq: r.Seq, Head: r.Head, Target: r.Target, Entries: r.Entries})
		}
		c.Tables = append(c.Tables, tb)
	}
	m.tight.NoteTables(c, now)
	for _, n := range ans.Notices {
		kind, set, _ := strings.Cut(n, " ")
		for _, o := range f.members {
			if o == m {
				continue
			}
			if kind == "w" {
				o.tight.Note(set, now)
			}
			signal(o.changed)
		}
	}
	return nil
}

func (m *refMember) Changed() <-chan struct{} { return m.changed }
func (m *refMember) Tight(name string) bool   { return m.tight.Tight(name, time.Now()) }
func (m *refMember) Lease() time.Duration     { return m.fleet.lease }
func (m *refMember) FailOpen() bool           { return m.fleet.open }

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// sharedStore is a zone that admits within allowances of a fleet's ledger
// in memory, the only member; it is closed when t ends.
func sharedStore(t *testing.T) store {
	z := NewZone(1, true, nil)
	z.SetLedger(newRefFleet().join())
	t.Cleanup(func() { closeZone(z) })
	return store{acquire: z.Acquire, release: z.Release}
}

// closeZone closes z and waits for its asker to end (its calls under way,
// the allowance it gives back), so that a synctest bubble can end.
func closeZone(z *Zone) {
	z.Close()
	for {
		z.mu.Lock()
		running := z.asks.running
		z.mu.Unlock()
		if !running {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
