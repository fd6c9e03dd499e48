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
//     (head) and what it lacks beyond the idle units its instance holds
//     there (need), the instance's target (its share of the set, computed
//     by the engine from the reports), what it waits for by key (entries,
//     opaque here), and its place among the reports (seq); a report lives
//     until its expiry, renewed by the instance's calls while it waits.
//
// The rules:
//   - Exact: the allowances of a set sum to at most its cap whenever a
//     want is granted (a write that lowers an allowance is always applied;
//     a reload that lowers a cap only refuses more).
//   - Holds: each report whose instance is owed room for its head
//     (floor(target) - allowance is at least need: its units in flight
//     and its head fit within its target) holds need units against the
//     wants of the instances that reported after it, that do not report,
//     or that would pass their own target with the want. A report owed
//     less holds nothing: room it could not use would be idle.
//   - Reserve: a set keeps a tenth of its cap (rounded down) free of
//     spare. Spare (units granted ahead, which the instance may keep idle)
//     is granted only to a want that asks for some, only while no other
//     instance reports on the set, only from the room beyond the reserve,
//     and the spares of a set sum to at most the reserve: so the fleet's
//     idle units are at most the reserve.
//   - Versions: each call carries a version, increasing per instance; a
//     call older than the instance's last write in any set it touches (a
//     script that ran late) changes nothing. A call sent again (Again)
//     first sets the instance's allowance in its wants' sets back to what
//     they held when it was made.
//   - Notices: a report announces that its instance waits for the set
//     ("w <set>": the others give back their idle units there, and keep
//     none for ReportLife), when it is new and again once half of ReportLife
//     has passed since it last did; and
//     a write that lowers an allowance, or a report that holds less
//     room than it did (withdrawn, needing less, or its head beyond its
//     target once a want of the call was granted), where another
//     instance reports announces room ("f <set>": the reporters ask
//     again).
package fleetref

import (
	"math"
	"slices"

	"github.com/caddy-inflight/caddy-inflight/inflight/fleet"
)

// Ledger is one zone's sets, and the sequence of its reports' places.
type Ledger struct {
	sets map[string]*set
	seq  int64
}

type set struct {
	allow   map[string]*Allowance
	reports map[string]*Report
	// grantedUnder is the highest cap a want was granted under since the
	// set last counted nothing: what the fleet holds the set to where its
	// requests carry different caps. It is for tests; no rule reads it.
	grantedUnder int64
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
	Need     int64
	Target   float64
	Entries  string
	Expiry   int64 // ms
	Notified int64 // ms: when it last announced itself
}

// Caller is who makes a call, and how long what it writes lives.
type Caller struct {
	Instance   string
	Version    int64
	Lease      int64 // ms an allowance written lives
	ReportLife int64 // ms a report lives
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
	s.forgetCapsIfEmpty()
	return s
}

// forgetCapsIfEmpty starts grantedUnder again once the set counts nothing.
func (s *set) forgetCapsIfEmpty() {
	if s.level() == 0 {
		s.grantedUnder = 0
	}
}

// Apply runs c, made by who, at now (ms), and sets its answers. It
// returns the notices it publishes, and stale if the call was older than
// a write of its instance (then nothing is applied nor answered).
func (l *Ledger) Apply(now int64, who Caller, c *fleet.Call) (notices []string, stale bool) {
	me := who.Instance
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
		if a := l.load(name, now).allow[me]; a != nil && a.Version > who.Version {
			return nil, true
		}
	}
	if c.Again {
		for _, w := range c.Wants {
			for k, name := range w.Sets {
				l.sets[name].put(me, w.Allowance[k], w.AllowanceSpare[k], now+who.Lease, who.Version)
			}
		}
	}
	for _, w := range c.Writes {
		s := l.sets[w.Set]
		old := s.units(me)
		s.put(me, w.Units, w.Spare, now+who.Lease, who.Version)
		if w.Units < old && s.othersReport(me) {
			notices = append(notices, "f "+w.Set)
		}
	}
	var tables []string
	for _, r := range c.Reports {
		s := l.sets[r.Set]
		old := s.reports[me]
		held := s.held(me)
		if r.Head <= 0 {
			delete(s.reports, me)
			if held > 0 && s.othersReport(me) {
				notices = append(notices, "f "+r.Set)
			}
			continue
		}
		notified := int64(0)
		if old != nil {
			notified = old.Notified
		}
		if old == nil || now-notified >= who.ReportLife/2 {
			notices = append(notices, "w "+r.Set)
			notified = now
		}
		seq := int64(0)
		if old != nil && !r.New {
			seq = old.Seq
		} else {
			l.seq++
			seq = l.seq
		}
		s.reports[me] = &Report{Seq: seq, Head: r.Head, Need: r.Need, Target: r.Target, Entries: r.Entries, Expiry: now + who.ReportLife, Notified: notified}
		if s.held(me) < held && s.othersReport(me) {
			notices = append(notices, "f "+r.Set)
		}
		tables = appendOnce(tables, r.Set)
	}
	reserved := map[string]bool{}
	for i := range c.Wants {
		w := &c.Wants[i]
		w.Levels = make([]int64, len(w.Sets))
		w.Granted = make([]int64, len(w.Sets))
		w.Refused = 0
		for k, name := range w.Sets {
			s := l.sets[name]
			level := s.level()
			w.Levels[k] = level - s.spares()
			if reserved[name] || level+w.Units[k]+s.holds(me, w.Units[k]) > w.Caps[k] {
				w.Refused = k + 1
				for j := k + 1; j < len(w.Sets); j++ {
					w.Levels[j] = -1
				}
				break
			}
		}
		if w.Refused == 0 {
			for k, name := range w.Sets {
				s := l.sets[name]
				was := s.held(me)
				a := s.allow[me]
				if a == nil {
					a = &Allowance{}
					s.allow[me] = a
				}
				a.Units += w.Units[k]
				a.Expiry, a.Version = now+who.Lease, who.Version
				s.grantedUnder = max(s.grantedUnder, w.Caps[k])
				if w.Spares[k] > 0 && !s.othersReport(me) {
					reserve := w.Caps[k] / 10
					spare := max(0, min(w.Spares[k], reserve-s.spares(), w.Caps[k]-reserve-s.level()))
					a.Units += spare
					a.Spare += spare
					w.Granted[k] = spare
				}
				w.Levels[k] = s.level() - s.spares()
				if s.held(me) < was && s.othersReport(me) { // its own grant ended the room its report held
					notices = append(notices, "f "+name)
				}
			}
		} else if w.Waits {
			name := w.Sets[w.Refused-1]
			reserved[name] = true
			for k, hold := range w.Holds {
				if hold {
					reserved[w.Sets[k]] = true
				}
			}
			tables = appendOnce(tables, name)
		}
	}
	for _, name := range touched {
		l.sets[name].forgetCapsIfEmpty()
	}
	c.Tables = c.Tables[:0]
	for _, name := range tables {
		c.Tables = append(c.Tables, l.sets[name].table(name, me))
	}
	return notices, false
}

// put sets inst's allowance, absolute; none if units and spare are 0.
func (s *set) put(inst string, units, spare, expiry, version int64) {
	if units == 0 && spare == 0 {
		delete(s.allow, inst)
		return
	}
	s.allow[inst] = &Allowance{Units: units, Spare: spare, Expiry: expiry, Version: version}
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
		n += s.held(inst)
	}
	return n
}

// held is the room inst's report holds in s: its need, if it is owed
// room for its head, else none.
func (s *set) held(inst string) int64 {
	r := s.reports[inst]
	if r == nil || int64(math.Floor(r.Target))-s.units(inst) < r.Need {
		return 0
	}
	return r.Need
}

// units is inst's allowance in s.
func (s *set) units(inst string) int64 {
	if a := s.allow[inst]; a != nil {
		return a.Units
	}
	return 0
}

// table is s as a call's answer shows it to me: every instance's
// allowance and report, in the order of their names.
func (s *set) table(name, me string) fleet.Table {
	var insts []string
	for inst := range s.allow {
		insts = append(insts, inst)
	}
	for inst := range s.reports {
		if s.allow[inst] == nil {
			insts = append(insts, inst)
		}
	}
	slices.Sort(insts)
	t := fleet.Table{Set: name}
	for _, inst := range insts {
		m := fleet.Member{Self: inst == me, Units: s.units(inst)}
		if r := s.reports[inst]; r != nil {
			m.Reports, m.Seq, m.Head, m.Need, m.Target, m.Entries = true, r.Seq, r.Head, r.Need, r.Target, r.Entries
		}
		t.Members = append(t.Members, m)
	}
	return t
}

func appendOnce(names []string, name string) []string {
	if slices.Contains(names, name) {
		return names
	}
	return append(names, name)
}
