package limiter

import (
	"errors"
	"fmt"
	"sync"
	"testing"
)

// memFleet is a fleet's ledger in memory: the rules a shared store keeps
// (see Ledger). Per set (a limit's key, by name, or the total), each
// member's allowance and spare; the allowances of a set never sum above
// its cap; spare is granted only from the room beyond the reserve (a tenth
// of the cap), and the spares of a set never sum above it. A want refused
// that waits marks each of its sets wanted by its member, with its units,
// until a call of that member no longer asks for it: the first member that marked
// a set holds its units there against the wants of the others (so a big
// request waiting at one instance is not passed for ever by small ones at
// the others), the set is tight for the others (they give back their idle
// allowance), and every member wanting a set hears (Changed) when another
// gives units of it back.
type memFleet struct {
	mu      sync.Mutex
	sets    map[string]*memSet
	members []*memMember
	fail    bool // Ask fails
	seq     int
}

type memSet struct {
	cap          int64
	alloc, spare map[*memMember]int64
	wanted       map[*memMember]want // by member: its units, and when it first wanted
}

type want struct {
	units int64
	seq   int
}

// memMember is one instance's ledger on a memFleet.
type memMember struct {
	fleet   *memFleet
	changed chan struct{}
	names   map[Set]string // the sets it asked for, by name
	calls   int
}

func newMemFleet() *memFleet { return &memFleet{sets: map[string]*memSet{}} }

// join returns a new member's ledger.
func (f *memFleet) join() *memMember {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := &memMember{fleet: f, changed: make(chan struct{}, 1), names: map[Set]string{}}
	f.members = append(f.members, m)
	return m
}

func (f *memFleet) set(name string) *memSet {
	s := f.sets[name]
	if s == nil {
		s = &memSet{alloc: map[*memMember]int64{}, spare: map[*memMember]int64{}, wanted: map[*memMember]want{}}
		f.sets[name] = s
	}
	return s
}

// allocated returns the units a set's allowances sum to.
func (s *memSet) allocated() (units, spare int64) {
	for m, u := range s.alloc {
		units += u
		spare += s.spare[m]
	}
	return units, spare
}

// held returns the allowance the fleet counts in the set named name.
func (f *memFleet) held(name string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.sets[name]; s != nil {
		u, _ := s.allocated()
		return u
	}
	return 0
}

func setName(s Set, keys []string) string {
	if s.Dim == TotalDim {
		return "total"
	}
	return fmt.Sprint(s.Dim, "/", keys[s.Dim])
}

func (m *memMember) Ask(c *Call) error {
	f := m.fleet
	f.mu.Lock()
	defer f.mu.Unlock()
	m.calls++
	if f.fail {
		return errors.New("memFleet: no answer")
	}
	wanting := map[*memSet]bool{} // the sets m still wants after the call
	for _, r := range c.Returns {
		s := f.set(m.names[r.Set])
		s.alloc[m] -= r.Units
		s.spare[m] = r.Spare
		if s.alloc[m] < 0 {
			panic("memFleet: more given back than held")
		}
		for w := range s.wanted {
			signal(w.changed)
		}
	}
	reserved := map[string]bool{}
	for i := range c.Wants {
		w := &c.Wants[i]
		names := make([]string, len(w.Sets))
		w.Outcome = Admitted
		for k, set := range w.Sets {
			names[k] = setName(set, w.Keys)
			m.names[set] = names[k]
			s := f.set(names[k])
			s.cap = w.Caps[k]
			if u, _ := s.allocated(); w.Outcome == Admitted && (reserved[names[k]] || u+w.Units+s.heldFor(m) > s.cap) {
				w.Outcome, w.Dim = Full, set.Dim
			}
		}
		if w.Outcome != Admitted {
			if w.Waits {
				for k, set := range w.Sets {
					if set.Dim == w.Dim || containsDim(w.Hold, set.Dim) {
						reserved[names[k]] = true
					}
					f.want(m, f.sets[names[k]], w.Units)
					wanting[f.sets[names[k]]] = true
				}
			}
			continue
		}
		for k, set := range w.Sets {
			s := f.sets[names[k]]
			s.alloc[m] += w.Units
			units, spares := s.allocated()
			reserve := s.cap / 10
			room := s.cap - units - s.heldFor(m)
			spare := max(0, min(w.Spares[k], reserve-(spares-s.spare[m]), room))
			if spare > 0 {
				extra := max(0, min(spare, room))
				s.alloc[m] += extra
				s.spare[m] = spare
				c.Grants = append(c.Grants, Units{Set: set, Units: extra, Spare: spare})
			}
		}
	}
	for _, s := range f.sets {
		if _, ok := s.wanted[m]; ok && !wanting[s] {
			delete(s.wanted, m)
		}
	}
	return nil
}

// heldFor returns the units s holds against m's wants: those of the
// member that first marked it wanted, if another.
func (s *memSet) heldFor(m *memMember) int64 {
	var first *memMember
	for o, w := range s.wanted {
		if first == nil || w.seq < s.wanted[first].seq {
			first = o
		}
	}
	if first == nil || first == m {
		return 0
	}
	return s.wanted[first].units
}

// want marks s wanted by m (keeping when it first did), and tells the
// others holding it.
func (f *memFleet) want(m *memMember, s *memSet, units int64) {
	w, ok := s.wanted[m]
	if !ok {
		f.seq++
		w.seq = f.seq
	}
	w.units = units
	s.wanted[m] = w
	for o, u := range s.alloc {
		if o != m && u > 0 {
			signal(o.changed)
		}
	}
}

func (m *memMember) Changed() <-chan struct{} { return m.changed }

func (m *memMember) Tight(set Set) bool {
	f := m.fleet
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.sets[m.names[set]]
	if s == nil {
		return false
	}
	for o := range s.wanted {
		if o != m {
			return true
		}
	}
	return false
}

func (m *memMember) Correct(int, string, float64) {}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func containsDim(dims []int, d int) bool {
	for _, x := range dims {
		if x == d {
			return true
		}
	}
	return false
}

// sharedStore is a zone that admits within allowances of a fleet's ledger
// in memory, the only member; it is closed when t ends.
func sharedStore(t *testing.T) store {
	z := NewZone(1, true, nil)
	z.SetLedger(newMemFleet().join())
	t.Cleanup(z.Close)
	return store{acquire: z.Acquire, release: z.Release}
}
