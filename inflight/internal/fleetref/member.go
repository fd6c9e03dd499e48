package fleetref

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/fleet"
)

// Fleet is a fleet whose ledger is the reference, in memory, on the
// clock of time.Now (virtual under synctest), for tests: its members are
// the zones' ledgers (limiter.Ledger), and notices reach them at once.
type Fleet struct {
	mu      sync.Mutex
	ledger  *Ledger
	members []*Member
	// Lease is how long an allowance lives; Latency each call's round
	// trip; Fail makes every call fail; Closed makes members fail closed.
	Lease   time.Duration
	Latency time.Duration
	Fail    bool
	Closed  bool
	// Spun, if set, is told of a member that asks again and again for
	// ever (see spinCalls), whose calls then fail, in place of the panic:
	// a test that reports it can shrink the scenario.
	Spun  func(spin string)
	epoch uint64
}

// NewFleet returns a fleet with an empty ledger and leases of 30 s.
func NewFleet() *Fleet { return &Fleet{ledger: New(), Lease: 30 * time.Second} }

// Member is one instance's ledger on a Fleet.
type Member struct {
	fleet   *Fleet
	id      string
	version int64
	changed chan struct{}
	tight   fleet.Tightness
	calls   int
	// instant is when m last called, and inInstant its calls then.
	instant   time.Time
	inInstant int
}

// spinCalls is more calls than one member makes in one instant unless it
// asks again and again for ever, the clock standing still (the fleet
// model's scenarios make fewer than 50).
const spinCalls = 10000

// Join returns a new member's ledger.
func (f *Fleet) Join() *Member {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := &Member{fleet: f, id: string(rune('a' + len(f.members))), changed: make(chan struct{}, 1)}
	f.members = append(f.members, m)
	return m
}

// Set sets the fleet's options under its lock, while members may call.
func (f *Fleet) Set(fn func(*Fleet)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// Recover makes calls succeed again after Fail, as a ledger that may
// have lost what was written (a new epoch), and tells every member.
func (f *Fleet) Recover() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Fail = false
	f.epoch++
	for _, m := range f.members {
		select {
		case m.changed <- struct{}{}:
		default:
		}
	}
}

// Forget drops everything the ledger holds, as a Redis that restarted
// empty.
func (f *Fleet) Forget() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ledger = New()
}

// Level returns the units the fleet counts in set name now.
func (f *Fleet) Level(name string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ledger.load(name, time.Now().UnixMilli()).level()
}

// GrantedUnder returns the highest cap the fleet granted a want of set
// name under since the set last counted nothing: where a key's requests
// carry different caps, the fleet holds it to this one (see
// docs/fleet-guarantees.md); 0 if it counts nothing now.
func (f *Fleet) GrantedUnder(name string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ledger.load(name, time.Now().UnixMilli()).grantedUnder
}

// ForgetCaps starts every set's GrantedUnder again, as a reload does:
// the engine gives back what it holds under caps that no longer apply.
func (f *Fleet) ForgetCaps() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.ledger.sets {
		s.grantedUnder = 0
	}
}

// Held returns the units the fleet counts now, over every set.
func (f *Fleet) Held() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now().UnixMilli()
	var n int64
	for name := range f.ledger.sets {
		n += f.ledger.load(name, now).level()
	}
	return n
}

// Calls returns how many calls m made.
func (m *Member) Calls() int {
	m.fleet.mu.Lock()
	defer m.fleet.mu.Unlock()
	return m.calls
}

// Ask applies c to the fleet's ledger, after half the latency, and
// answers after the other half.
func (m *Member) Ask(c *fleet.Call) error {
	f := m.fleet
	if m.countInstant() {
		return errSpun
	}
	time.Sleep(f.Latency / 2)
	defer time.Sleep(f.Latency / 2)
	f.mu.Lock()
	defer f.mu.Unlock()
	m.calls++
	if f.Fail {
		return errors.New("fleetref: no answer")
	}
	m.version++
	now := time.Now()
	notices, stale := f.ledger.Apply(now.UnixMilli(), Caller{Instance: m.id, Version: m.version,
		Lease: f.Lease.Milliseconds(), ReportLife: fleet.ReportLife.Milliseconds()}, c)
	if stale {
		return errors.New("fleetref: stale call")
	}
	m.tight.NoteTables(c, now)
	for _, n := range notices {
		kind, set, _ := strings.Cut(n, " ")
		for _, o := range f.members {
			if o == m {
				continue
			}
			if kind == "w" {
				o.tight.Note(set, now)
			}
			select {
			case o.changed <- struct{}{}:
			default:
			}
		}
	}
	return nil
}

// errSpun fails the calls of a member that spun (see Fleet.Spun).
var errSpun = errors.New("fleetref: the member asks again and again for ever")

// countInstant counts m's call in its instant, and at spinCalls reports
// that the member asks again and again for ever: to f.Spun if set (and
// the call fails), else by a panic, as a test would otherwise hang with
// nothing to say why.
func (m *Member) countInstant() (spun bool) {
	f := m.fleet
	f.mu.Lock()
	defer f.mu.Unlock()
	if now := time.Now(); !now.Equal(m.instant) {
		m.instant, m.inInstant = now, 0
	}
	if m.inInstant++; m.inInstant < spinCalls {
		return false
	}
	spin := fmt.Sprintf("instance %s called the ledger %d times in one instant: it asks again and again for ever", m.id, m.inInstant)
	if f.Spun == nil {
		panic("fleetref: " + spin)
	}
	f.Spun(spin)
	return true
}

// Changed receives when another member's call announced something.
func (m *Member) Changed() <-chan struct{} { return m.changed }

// Tight reports whether another member waits for set name.
func (m *Member) Tight(name string) bool { return m.tight.Tight(name, time.Now()) }

// Lease is the fleet's lease.
func (m *Member) Lease() time.Duration {
	m.fleet.mu.Lock()
	defer m.fleet.mu.Unlock()
	return m.fleet.Lease
}

// Epoch counts the fleet's recoveries.
func (m *Member) Epoch() uint64 {
	m.fleet.mu.Lock()
	defer m.fleet.mu.Unlock()
	return m.fleet.epoch
}

// FailOpen is true unless the fleet fails closed.
func (m *Member) FailOpen() bool {
	m.fleet.mu.Lock()
	defer m.fleet.mu.Unlock()
	return !m.fleet.Closed
}
