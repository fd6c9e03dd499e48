// Package fleetref is the reference of the rules a fleet's ledger keeps:
// what redisstore's call script does in Redis, written as plain Go over
// maps. The engine's tests run zones on it as their fleet, and
// redisstore's differential test drives it and the script with the same
// calls and compares every answer, so the script is pinned to these rules.
//
// A ledger keeps, per set (a limit's key, or a zone's total, by name):
//   - each instance's allowance: the units the fleet counts for it there,
//     in flight or idle, and its spare, how many of them it may keep idle;
//     each lives until its expiry (a lease), renewed by the instance's
//     calls, so a dead instance's allowance comes back within one lease;
//   - each waiting instance's report: the units of its first waiter there
//     (head), the instance's target (its share of the set, computed by the
//     engine from the reports), what it waits for by key (entries, opaque
//     here), and its place among the reports (seq); a report lives until
//     its expiry, renewed by the instance's calls while it waits.
//
// The rules:
//   - Exact: the allowances of a set sum to at most its cap whenever a
//     want is granted (a write that lowers an allowance is always applied;
//     a reload that lowers a cap only refuses more).
//   - Holds: each report whose instance is owed room for its head
//     (floor(target) - allowance is at least head) holds head units
//     against the wants of the instances that reported after it, that do
//     not report, or that would pass their own target with the want. A
//     report owed less holds nothing: room it could not use would be
//     idle.
//   - Reserve: a set keeps a tenth of its cap (rounded down) free of
//     spare. Spare (units granted ahead, which the instance may keep idle)
//     is granted only to a want that asks for some, only while no other
//     instance reports on the set, only from the room beyond the reserve,
//     and the spares of a set sum to at most the reserve: so the fleet's
//     idle units are at most the reserve.
//   - Versions: each call carries a version, increasing per instance; a
//     call older than the instance's last write in any set it touches (a
//     script that ran late) changes nothing.
//   - Notices: a report announces that its instance waits for the set
//     ("w <set>": the others give back their idle units there, and keep
//     none for Listing), when it is new and again once half of Listing
//     has passed since it last did; and
//     a write that lowers an allowance where another instance reports
//     announces room ("f <set>": the reporters ask again).
package fleetref

import (
	"math"
	"slices"
)

// Ledger is one zone's sets, and the sequence of its reports' places.
type Ledger struct {
	sets map[string]*set
	seq  int64
}

type set struct {
	allow   map[string]*Allowance
	reports map[string]*Report
}

// Allowance is an instance's allowance in a set.
type Allowance struct {
	Units, Spare    int64
	Expiry, Version int64 // ms
}

// Report is an instance's report on a set, as kept.
type Report struct {
	Seq      int64
	Head     int64
	Target   float64
	Entries  string
	Expiry   int64 // ms
	Notified int64 // ms: when it last announced itself
}

// Call is one call of an instance.
type Call struct {
	Instance string
	Version  int64
	Lease    int64 // ms an allowance written lives
	Listing  int64 // ms a report lives
	Writes   []Write
	Reports  []ReportIn
	Wants    []Want
}

// Write sets the instance's allowance in a set, absolute: what it holds
// after its returns.
type Write struct {
	Set          string
	Units, Spare int64
}

// ReportIn (re)places the instance's report on a set; Head 0 withdraws
// it. New gives it a new place (its first waiter changed).
type ReportIn struct {
	Set     string
	New     bool
	Head    int64
	Target  float64
	Entries string
}

// Want asks for Units[k] in each set Sets[k], all or none, each within its
// cap. Spares are the idle units asked beyond them (0: none). A want that
// Waits, refused, holds against the call's later wants its refusing set
// and each set with Holds.
type Want struct {
	Sets   []string
	Caps   []int64
	Units  []int64
	Spares []int64
	Waits  bool
	Holds  []bool
}

// Answer is what a call gets back.
type Answer struct {
	Now   int64
	Stale bool // the call was older than a write: nothing applied
	// Per want: 0 granted, else the 1-based index of its set that
	// refused it; its sets' levels once it was decided (-1: not read);
	// and the spare granted in each (units granted idle beyond it).
	Refused []int
	Levels  [][]int64
	Spares  [][]int64
	// Tables are the sets reported on, then those that refused a waiting
	// want, once each in that order: every live allowance and report.
	Tables  []Table
	Notices []string
}

// Table is a set's allowances and reports, by instance.
type Table struct {
	Set     string
	Allow   map[string]Allowance
	Reports map[string]Report
}

// New returns an empty ledger.
func New() *Ledger { return &Ledger{sets: map[string]*set{}} }

// load returns set name, made if needed, with what expired by now gone.
func (l *Ledger) load(name string, now int64) *set {
	s := l.sets[name]
	if s == nil {
		s = &set{allow: map[string]*Allowance{}, reports: map[string]*Report{}}
		l.sets[name] = s
	}
	for inst, a := range s.allow {
		if a.Expiry <= now {
			delete(s.allow, inst)
		}
	}
	for inst, r := range s.reports {
		if r.Expiry <= now {
			delete(s.reports, inst)
		}
	}
	return s
}

// Apply runs c at now (ms).
func (l *Ledger) Apply(now int64, c Call) Answer {
	ans := Answer{Now: now}
	me := c.Instance
	var touched []string
	for _, w := range c.Writes {
		touched = append(touched, w.Set)
	}
	for _, r := range c.Reports {
		touched = append(touched, r.Set)
	}
	for _, w := range c.Wants {
		touched = append(touched, w.Sets...)
	}
	for _, name := range touched {
		if a := l.load(name, now).allow[me]; a != nil && a.Version > c.Version {
			ans.Stale = true
			return ans
		}
	}
	for _, w := range c.Writes {
		s := l.sets[w.Set]
		old := int64(0)
		if a := s.allow[me]; a != nil {
			old = a.Units
		}
		if w.Units == 0 && w.Spare == 0 {
			delete(s.allow, me)
		} else {
			s.allow[me] = &Allowance{Units: w.Units, Spare: w.Spare, Expiry: now + c.Lease, Version: c.Version}
		}
		if w.Units < old && s.othersReport(me) {
			ans.Notices = append(ans.Notices, "f "+w.Set)
		}
	}
	var tables []string
	for _, r := range c.Reports {
		s := l.sets[r.Set]
		old := s.reports[me]
		if r.Head <= 0 {
			delete(s.reports, me)
			continue
		}
		notified := int64(0)
		if old != nil {
			notified = old.Notified
		}
		if old == nil || now-notified >= c.Listing/2 {
			ans.Notices = append(ans.Notices, "w "+r.Set)
			notified = now
		}
		seq := int64(0)
		if old != nil && !r.New {
			seq = old.Seq
		} else {
			l.seq++
			seq = l.seq
		}
		s.reports[me] = &Report{Seq: seq, Head: r.Head, Target: r.Target, Entries: r.Entries, Expiry: now + c.Listing, Notified: notified}
		tables = appendOnce(tables, r.Set)
	}
	reserved := map[string]bool{}
	for _, w := range c.Wants {
		levels := make([]int64, len(w.Sets))
		spares := make([]int64, len(w.Sets))
		refused := 0
		for k, name := range w.Sets {
			s := l.sets[name]
			level := s.level()
			levels[k] = level
			if reserved[name] || level+w.Units[k]+s.holds(me, w.Units[k]) > w.Caps[k] {
				refused = k + 1
				for j := k + 1; j < len(w.Sets); j++ {
					levels[j] = -1
				}
				break
			}
		}
		if refused == 0 {
			for k, name := range w.Sets {
				s := l.sets[name]
				a := s.allow[me]
				if a == nil {
					a = &Allowance{}
					s.allow[me] = a
				}
				a.Units += w.Units[k]
				a.Expiry, a.Version = now+c.Lease, c.Version
				if w.Spares[k] > 0 && !s.othersReport(me) {
					reserve := w.Caps[k] / 10
					spare := max(0, min(w.Spares[k], reserve-s.spares(), w.Caps[k]-reserve-s.level()))
					a.Units += spare
					a.Spare += spare
					spares[k] = spare
				}
				levels[k] = s.level()
			}
		} else if w.Waits {
			name := w.Sets[refused-1]
			reserved[name] = true
			for k, hold := range w.Holds {
				if hold {
					reserved[w.Sets[k]] = true
				}
			}
			tables = appendOnce(tables, name)
		}
		ans.Refused = append(ans.Refused, refused)
		ans.Levels = append(ans.Levels, levels)
		ans.Spares = append(ans.Spares, spares)
	}
	for _, name := range tables {
		ans.Tables = append(ans.Tables, l.sets[name].table(name))
	}
	return ans
}

// level is the units the set's allowances sum to.
func (s *set) level() int64 {
	var n int64
	for _, a := range s.allow {
		n += a.Units
	}
	return n
}

// spares sums the set's spares.
func (s *set) spares() int64 {
	var n int64
	for _, a := range s.allow {
		n += a.Spare
	}
	return n
}

// othersReport reports whether an instance other than me reports on s.
func (s *set) othersReport(me string) bool {
	for inst := range s.reports {
		if inst != me {
			return true
		}
	}
	return false
}

// holds sums the room the reports hold against a want of units by me:
// those placed before me's, or all if me reports none or would pass its
// target.
func (s *set) holds(me string, units int64) int64 {
	mine := s.reports[me]
	all := mine == nil || s.units(me)+units > int64(math.Floor(mine.Target))
	var n int64
	for inst, r := range s.reports {
		if inst == me || !all && r.Seq > mine.Seq {
			continue
		}
		if int64(math.Floor(r.Target))-s.units(inst) >= r.Head {
			n += r.Head
		}
	}
	return n
}

// units is inst's allowance in s.
func (s *set) units(inst string) int64 {
	if a := s.allow[inst]; a != nil {
		return a.Units
	}
	return 0
}

func (s *set) table(name string) Table {
	t := Table{Set: name, Allow: map[string]Allowance{}, Reports: map[string]Report{}}
	for inst, a := range s.allow {
		t.Allow[inst] = *a
	}
	for inst, r := range s.reports {
		t.Reports[inst] = *r
	}
	return t
}

func appendOnce(names []string, name string) []string {
	if slices.Contains(names, name) {
		return names
	}
	return append(names, name)
}

// Instances lists the instances with an allowance or a report in t, in
// order.
func (t Table) Instances() []string {
	var out []string
	for inst := range t.Allow {
		out = append(out, inst)
	}
	for inst := range t.Reports {
		if _, ok := t.Allow[inst]; !ok {
			out = append(out, inst)
		}
	}
	slices.Sort(out)
	return out
}
