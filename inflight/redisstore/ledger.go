package redisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/fleet"
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
	"github.com/caddy-inflight/caddy-inflight/inflight/storestatus"
)

// ledger is one zone's ledger in Redis (a limiter.Ledger): it sends the
// zone's calls as callScript, one at a time (the zone's asker makes
// them), and hears the notices of the other instances on the book's
// subscription. It knows nothing of the zone's allowances: the zone writes
// them, absolute, in its calls.
type ledger struct {
	book    *book
	tag     string // "<prefix>:a1:{<fleet id>}": the zone's keys, one cluster slot
	label   string // the zone's name in metrics and logs
	changed chan struct{}
	tight   fleet.Tightness
	closed  atomic.Bool
}

// versions count this process's calls, over every ledger (a zone's new
// ledger writes over its old one's), so that a script that ran late
// changes nothing a later call wrote; a call that gets no answer is
// followed, in the zone's next one, by every allowance written again.
var versions atomic.Int64

// errUnavailable fails a call made while Redis is left alone after a
// failure: the zone decides alone (on_error).
var errUnavailable = errors.New("redis is left alone after a failure")

// errStale is a reply that says a later call of this instance wrote
// first: it cannot be, but for a script that ran late.
var errStale = errors.New("redis ran an older call after a newer one")

// Ask sends c as one callScript, within timeout, and reads its answers.
// A call counts as a user of the book while it runs.
func (l *ledger) Ask(c *fleet.Call) error {
	l.book.enter()
	defer l.book.exit()
	if !l.book.available() {
		return errUnavailable
	}
	op := "acquire"
	if len(c.Wants) == 0 {
		op = "release"
	}
	start := time.Now()
	err := l.send(c)
	if staleConnection(err) {
		// The connection broke under the call (a reset, Redis closing
		// it): it may have run. Sent again, newer, it first sets back
		// what its wants' sets held, then decides them afresh; its
		// writes are absolute.
		c.Again = true
		err = l.send(c)
	}
	l.book.observe(op, []string{l.label}, start, asLate(err))
	return err
}

// send runs c once.
func (l *ledger) send(c *fleet.Call) error {
	localDeadline := localMicros() + l.book.timeout.Microseconds()
	ctx, cancel := context.WithTimeout(storeContext, l.book.timeout)
	defer cancel()
	deadline, err := l.book.deadline(ctx, l.tag, localDeadline)
	if err != nil {
		return err
	}
	keys, args := l.encode(c, callHeader{deadline, l.book.lease.Milliseconds(), fleet.ReportLife.Milliseconds(), versions.Add(1)})
	sentAt := localMicros()
	reply, err := callScript.Run(ctx, l.book.client, keys, args).Slice()
	l.book.learnClock(l.tag, replyInts(reply), err, sentAt)
	if err != nil {
		return asLate(err)
	}
	return l.decode(c, keys, reply)
}

// callHeader is what a call's script is told besides the call: its
// deadline (Redis time, µs), the lease and a report's life (ms), and the
// call's version.
type callHeader struct {
	deadline, lease, reportLife, version int64
}

// encode returns the keys and the argument of c's script (see callScript).
func (l *ledger) encode(c *fleet.Call, h callHeader) ([]string, string) {
	n := 1 + len(c.Writes) + len(c.Reports)
	for _, w := range c.Wants {
		n += len(w.Sets)
	}
	keys := make([]string, 1, n)
	keys[0] = l.tag + ":~seq"
	index := make(map[string]int, n)
	key := func(set string) int64 {
		i, ok := index[set]
		if !ok {
			keys = append(keys, l.tag+":"+set)
			i = len(keys)
			index[set] = i
		}
		return int64(i)
	}
	a := newScriptArgs(64 + 12*len(c.Writes) + 48*len(c.Reports) + 40*len(c.Wants))
	a.int(h.deadline)
	a.int(h.lease)
	a.int(h.reportLife)
	a.str(l.book.instance)
	a.int(h.version)
	a.int(int64(len(l.tag) + 2))
	a.flag(c.Again)
	a.int(int64(len(c.Writes)))
	for _, w := range c.Writes {
		a.int(key(w.Set))
		a.int(w.Units)
		a.int(w.Spare)
	}
	a.int(int64(len(c.Reports)))
	for _, r := range c.Reports {
		a.int(key(r.Set))
		a.flag(r.New)
		a.int(r.Head)
		a.int(r.Need)
		a.str(strconv.FormatFloat(r.Target, 'g', -1, 64))
		a.str(r.Entries)
	}
	a.int(int64(len(c.Wants)))
	for _, w := range c.Wants {
		a.int(int64(len(w.Sets)))
		a.flag(w.Waits)
		for k, set := range w.Sets {
			a.int(key(set))
			a.int(w.Caps[k])
			a.int(w.Units[k])
			a.int(w.Spares[k])
			a.flag(w.Holds[k])
			a.int(w.Allowance[k])
			a.int(w.AllowanceSpare[k])
		}
	}
	return keys, a.packed()
}

// decode sets c's answers from the script's reply.
func (l *ledger) decode(c *fleet.Call, keys []string, reply []any) error {
	r := replyReader{reply: reply, at: 2}
	if r.int() == 1 {
		return errStale
	}
	for i := range c.Wants {
		w := &c.Wants[i]
		w.Refused = int(r.int())
		w.Levels, w.Granted = make([]int64, len(w.Sets)), make([]int64, len(w.Sets))
		for k := range w.Sets {
			w.Levels[k], w.Granted[k] = r.int(), r.int()
		}
	}
	c.Tables = c.Tables[:0]
	for range r.int() {
		set := strings.TrimPrefix(keys[r.int()-1], l.tag+":")
		fields := make([][2]string, r.int())
		for j := range fields {
			fields[j] = [2]string{r.str(), r.str()}
		}
		c.Tables = append(c.Tables, tableOf(set, fields, l.book.instance))
	}
	if r.err != nil {
		return fmt.Errorf("redis store: a reply not of the script's shape: %w", r.err)
	}
	l.tight.NoteTables(c, time.Now())
	return nil
}

// tableOf reads a set's fields into a table, its members in the order of
// their instances' names (as the reference gives them).
func tableOf(set string, fields [][2]string, me string) fleet.Table {
	members := map[string]*fleet.Member{}
	member := func(inst string) *fleet.Member {
		m := members[inst]
		if m == nil {
			m = &fleet.Member{Self: inst == me}
			members[inst] = m
		}
		return m
	}
	for _, f := range fields {
		name, value := f[0], f[1]
		if inst, ok := strings.CutPrefix(name, "~r:"); ok {
			p := strings.SplitN(value, " ", 7)
			if len(p) < 6 {
				continue
			}
			m := member(inst)
			m.Reports = true
			m.Seq, _ = strconv.ParseInt(p[0], 10, 64)
			m.Head, _ = strconv.ParseInt(p[1], 10, 64)
			m.Need, _ = strconv.ParseInt(p[2], 10, 64)
			m.Target, _ = strconv.ParseFloat(p[3], 64)
			if len(p) == 7 {
				m.Entries = p[6]
			}
			continue
		}
		units, _, _ := strings.Cut(value, " ")
		member(name).Units, _ = strconv.ParseInt(units, 10, 64)
	}
	t := fleet.Table{Set: set}
	for _, inst := range slices.Sorted(maps.Keys(members)) {
		t.Members = append(t.Members, *members[inst])
	}
	return t
}

// replyReader reads a script's reply in order; a value of the wrong type
// or a reply too short sets err.
type replyReader struct {
	reply []any
	at    int
	err   error
}

func (r *replyReader) next() any {
	if r.at >= len(r.reply) {
		r.err = errors.New("too short")
		return nil
	}
	v := r.reply[r.at]
	r.at++
	return v
}

func (r *replyReader) int() int64 {
	v, ok := r.next().(int64)
	if !ok && r.err == nil {
		r.err = errors.New("a number expected")
	}
	return v
}

func (r *replyReader) str() string {
	v, ok := r.next().(string)
	if !ok && r.err == nil {
		r.err = errors.New("a string expected")
	}
	return v
}

// replyInts returns the time a reply starts with, for the clock.
func replyInts(reply []any) []int64 {
	if len(reply) < 2 {
		return nil
	}
	s, ok1 := reply[0].(int64)
	us, ok2 := reply[1].(int64)
	if !ok1 || !ok2 {
		return nil
	}
	return []int64{s, us}
}

// notice handles a notice of another instance on the zone's channel: one
// waits for a set ("w"), or gave units of it back ("f").
func (l *ledger) notice(msg string) {
	kind, set, ok := strings.Cut(msg, " ")
	if !ok {
		return
	}
	if kind == "w" {
		l.tight.Note(set, time.Now())
	}
	l.signal()
}

// signal wakes the zone's asker.
func (l *ledger) signal() {
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// Changed receives when another instance announced something, and when
// Redis answers again after a failure.
func (l *ledger) Changed() <-chan struct{} { return l.changed }

// Tight reports whether another instance waits for set name.
func (l *ledger) Tight(name string) bool { return l.tight.Tight(name, time.Now()) }

// Lease is how long an allowance lives unless written again.
func (l *ledger) Lease() time.Duration { return l.book.lease }

// Epoch counts the times Redis answered again after a failure: it may
// have lost what this instance wrote (a restart, a failover).
func (l *ledger) Epoch() uint64 { return l.book.epoch.Load() }

// FailOpen says whether a request short of allowance is admitted within
// this instance's share while Redis cannot answer (on_error open).
func (l *ledger) FailOpen() bool { return !l.book.closed }

// Health reports, for the admin API, whether Redis answered the latest
// operation of the zone's book.
func (l *ledger) Health() storestatus.Health {
	return storestatus.Health{Type: "redis", Reachable: !l.book.outage.Load() && l.book.available()}
}

// Close drops the zone's use of the book: it makes no more calls.
func (l *ledger) Close() error {
	if l.closed.CompareAndSwap(false, true) {
		l.book.dropLedger(l)
	}
	return nil
}

// Interface guards
var (
	_ limiter.Ledger       = (*ledger)(nil)
	_ storestatus.Reporter = (*ledger)(nil)
)
