// Package fleet is what a zone and its fleet's ledger say to each other:
// the calls a zone makes (writes, reports, wants) and their answers, and
// what a ledger keeps of the notices of the others. The zone's side is in
// package limiter (allowance.go, asking.go, report.go, target.go); the
// ledger's rules in redisstore's script, pinned to their reference,
// internal/fleetref.
package fleet

import (
	"sync"
	"time"
)

// A Call is what a zone sends its ledger in one round trip: writes first,
// then reports, then wants, in order.
type Call struct {
	Writes  []Write
	Reports []Report
	Wants   []Want
	// Again marks a call sent a second time because its connection broke
	// under it (it may have run): the ledger first sets this instance's
	// allowance in each want's sets back to what the want says it held
	// (Allowance, AllowanceSpare), so that what the first run granted is
	// not counted twice.
	Again bool
	// Tables are set by Ask: each set reported on (with a head), then
	// each that refused a waiting want, once.
	Tables []Table
}

// A Write sets this instance's allowance in a set, absolute: the units it
// holds there and the spare it keeps; zero for both drops it.
type Write struct {
	Set          string
	Units, Spare int64
}

// A Report tells the fleet that this instance waits for a set: the units
// of its first waiter needing it (Head; 0 withdraws the report) and what
// it lacks beyond the idle units this instance holds there (Need), its
// target there (see limiter/target.go), and what it waits for by key (Entries,
// opaque to the ledger). New places it after every report there: its
// first waiter changed.
type Report struct {
	Set     string
	New     bool
	Head    int64
	Need    int64
	Target  float64
	Entries string
}

// A Want asks for Units[k] in each set Sets[k] (what its request needs
// beyond the idle units this instance holds there), all or none, each
// within its cap (Caps). Spares are idle units asked ahead in each (0 for
// a set not used lately): granted, they add to the instance's spare
// there. A want that Waits, refused, holds against the call's later wants
// the set that refused it and each set of Holds (those that refused its
// request since it started waiting).
type Want struct {
	Sets   []string
	Caps   []int64
	Units  []int64
	Spares []int64
	Waits  bool
	Holds  []bool
	// Allowance and AllowanceSpare are this instance's allowance and
	// spare in each set when the call was made (see Again).
	Allowance, AllowanceSpare []int64

	// Set by Ask: Refused is 0 if granted, else the 1-based index of the
	// set that refused it; Levels, each set's allowances less their
	// spares (the units in flight, as far as the ledger knows) once it
	// was decided (-1: not read); Granted, the spare granted in each.
	Refused int
	Levels  []int64
	Granted []int64
}

// A Table is a set as the ledger holds it: every instance's allowance and
// report.
type Table struct {
	Set     string
	Members []Member
}

// A Member is one instance in a table.
type Member struct {
	Self  bool // this instance
	Units int64
	// Reports says it reports on the set: at place Seq, with its Head,
	// Need (the units its head lacks beyond its idle units there), Target
	// and Entries.
	Reports bool
	Seq     int64
	Head    int64
	Need    int64
	Target  float64
	Entries string
}

// ReportLife is how long a report lives in the ledger unless sent again: a
// waiter that left, or an instance that died, holds room for others at
// most this long.
const ReportLife = time.Second

// Tightness is what a ledger knows of the sets where other instances
// wait, for Tight: from its notices and from its calls' tables, each for
// ReportLife from when it learnt it.
type Tightness struct {
	mu    sync.RWMutex
	until map[string]time.Time
}

// Note records that another instance waits for set name, as of now.
func (t *Tightness) Note(name string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.until == nil {
		t.until = map[string]time.Time{}
	}
	if len(t.until) >= 1024 { // keep it small: drop what expired
		for n, u := range t.until {
			if !now.Before(u) {
				delete(t.until, n)
			}
		}
	}
	t.until[name] = now.Add(ReportLife)
}

// NoteTables records the sets of c's tables where another instance
// reports.
func (t *Tightness) NoteTables(c *Call, now time.Time) {
	for _, tb := range c.Tables {
		for _, m := range tb.Members {
			if m.Reports && !m.Self {
				t.Note(tb.Set, now)
				break
			}
		}
	}
}

// Tight reports whether another instance waited for set name within
// ReportLife of now.
func (t *Tightness) Tight(name string, now time.Time) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	u, ok := t.until[name]
	return ok && now.Before(u)
}
