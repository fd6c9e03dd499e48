package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
	"github.com/caddy-inflight/caddy-inflight/inflight/storestatus"
)

// books holds the book of every Redis setup in use, by a hash of its
// options. A reload that keeps the options keeps the book; one that changes
// them makes a new book, and the old one lives until its last lease and
// waiter are gone.
var books = struct {
	sync.Mutex
	m map[string]*book
}{m: map[string]*book{}}

// keySchema names the layout of a zone's keys (leases carrying their
// units, each set keeping their units beyond one in itself), after the key
// prefix: instances that count otherwise (a counter beside each set, u1,
// until 2026-12-03; none before) use other keys, so a fleet halfway
// through an upgrade counts in two groups rather than misreading each
// other's sets.
const keySchema = "u2"

// scriptChunk bounds the leases one renewal or release script handles, so
// that no script holds Redis for long.
const scriptChunk = 512

// book is the client of one Redis setup and this instance's record of the
// leases it holds there (see the package's invariants).
type book struct {
	id       string
	options  *redis.UniversalOptions
	lease    time.Duration
	timeout  time.Duration
	failure  failure // what the settings tell of a failure's cause
	prefix   string
	closed   bool   // on_error closed
	instance string // random, so members from different instances differ

	next   atomic.Uint64
	users  int // configs using the book; guarded by books
	mu     sync.Mutex
	leases map[string]*lease            // held, by member: renewed
	ended  map[string]map[string]*lease // released or ghosts, by zone tag and member: to remove
	zones  map[string]*redisZone
	clocks map[string]*redisClock // by zone tag: see clock.go
	asking sync.Mutex             // held while Redis is asked a zone's clock
	// client is nil while the book is closed. It is opened and closed
	// under mu, and closed only while active is 0: a goroutine between
	// enter (or tryEnter) and exit uses it without the lock.
	client redis.UniversalClient
	active int           // requests in Acquire, dispatches and renewals under way
	stop   chan struct{} // closed with the client

	downUntil atomic.Int64                  // unix nanos until which Redis is not tried; 0 once it answered
	probing   atomic.Bool                   // the prober runs (see probe.go)
	outage    atomic.Bool                   // from a failure until Redis answers
	rejoining atomic.Bool                   // from the end of an outage until every lease is written back
	back      atomic.Pointer[chan struct{}] // see whenBack
	outageLog outageLog                     // what the log says of outages (debounced)
	answered  atomic.Int64                  // unix nanos of Redis's latest answer
	renewNow  chan struct{}
	work      chan struct{}
	// renewGate, if set (by tests), holds every renewal until it is closed.
	renewGate atomic.Pointer[chan struct{}]
}

// lease is one member this instance put, or will put, in a zone's sets.
type lease struct {
	tag   string // the zone's hash-tagged prefix: its cluster slot
	sets  []string
	units int64 // in each set: also the end of its member's name
	// released is when its request ended: from then on it is in ended, and
	// removed, not renewed, until removed or expired anyway.
	released time.Time
	// ghost marks the members of an admission whose reply never came: the
	// script may still run later, so they are removed at once and again on
	// every tick until they would have expired.
	ghost bool
	// tried marks a ghost sent once: it goes again on ticks only, so a
	// Redis that is down is not sent it at every poke (each probe's).
	tried bool
	// unsure marks a lease that a failed renewal wrote: its script may
	// still run later, so once released the lease is removed as a ghost.
	unsure bool
	// again is set when a renewal that wrote the lease ended after its
	// release: a removal sent before then may have come first.
	again bool
	// sends counts the scripts under way that remove the lease: one, but
	// for an admission call that overtakes a removal of its own (alone).
	sends int
	alone bool
}

// joinBook returns the book for s's options, made if needed, and counts s
// as one of its users.
func joinBook(s *Store, id string) *book {
	books.Lock()
	defer books.Unlock()
	b := books.m[id]
	if b == nil {
		b = newBook(s, id)
		books.m[id] = b
	}
	b.users++
	return b
}

// leave drops one user; the book closes once nothing needs it.
func (b *book) leave() {
	books.Lock()
	b.users--
	books.Unlock()
	b.poke()
}

func newBook(s *Store, id string) *book {
	timeout := time.Duration(s.Timeout)
	b := &book{
		id:        id,
		options:   s.redisOptions(),
		lease:     time.Duration(s.Lease),
		timeout:   timeout,
		failure:   s.failure(),
		prefix:    s.KeyPrefix,
		closed:    s.OnError == "closed",
		instance:  randomID(),
		leases:    map[string]*lease{},
		ended:     map[string]map[string]*lease{},
		zones:     map[string]*redisZone{},
		clocks:    map[string]*redisClock{},
		work:      make(chan struct{}, 1),
		renewNow:  make(chan struct{}, 1),
		outageLog: outageLog{logger: s.logger, quiet: outageQuiet},
	}
	b.open()
	return b
}

// open starts the client and the goroutines that use it. mu must be held
// (or b not yet shared).
func (b *book) open() {
	b.client = redis.NewUniversalClient(b.options)
	b.stop = make(chan struct{})
	go b.listen(b.client, b.stop)
	go b.renewLoop(b.stop)
	go b.maintain()
}

// zone returns the store of one zone: id names the zone and its shape, so
// the whole fleet uses the same keys for the same limits. It is kept across
// reloads, with its waiters, while its local zone stays the same.
func (b *book) zone(id string, limits []string, hasTotal bool, local *limiter.Zone) *redisZone {
	b.mu.Lock()
	defer b.mu.Unlock()
	// The braces are a Redis Cluster hash tag: all of a zone's keys live in
	// one slot, as the scripts need. key_prefix has no braces (Validate).
	tag := b.prefix + ":" + keySchema + ":{" + id + "}"
	z := b.zones[tag]
	if z == nil || z.local != local {
		// A zone that left and came back has a new local zone: the old
		// store object keeps serving the requests it admitted.
		z = newRedisZone(b, tag, zoneLabel(id), limits, hasTotal, local)
		b.zones[tag] = z
	}
	return z
}

// zoneLabel is the zone's name in metrics and logs: its id less the hash
// of its shape.
func zoneLabel(id string) string {
	if i := strings.LastIndex(id, "/"); i > 0 {
		return id[:i]
	}
	return id
}

// labels returns the names of the zones of tags, for metrics and logs.
func (b *book) labels(tags []string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	labels := make([]string, 0, len(tags))
	for _, tag := range tags {
		if z := b.zones[tag]; z != nil && !slices.Contains(labels, z.label) {
			labels = append(labels, z.label)
		}
	}
	slices.Sort(labels)
	return labels
}

// member returns a new lease identifier, for a lease of units: the
// scripts read the units of an expired member from its name.
func (b *book) member(units int64) string {
	return b.instance + ":" + strconv.FormatUint(b.next.Add(1), 36) + ":" + strconv.FormatInt(units, 10)
}

// hold records a lease of units granted (or admitted locally) for renewal.
func (b *book) hold(member, tag string, sets []string, units int64) {
	b.mu.Lock()
	b.leases[member] = &lease{tag: tag, sets: sets, units: units}
	b.mu.Unlock()
}

// release marks a lease's request as ended. The zone's call under way's
// successor, or (if send) a removal of its own, removes it from Redis (see
// claim); a ghost's removal is maintain's.
func (b *book) release(member string, send bool) {
	b.mu.Lock()
	l := b.leases[member]
	var z *redisZone
	var ghost bool // read under mu: a renewal that ends may mark it (removeAgain)
	if l != nil {
		delete(b.leases, member)
		l.released = time.Now()
		l.ghost = l.unsure
		ghost = l.ghost
		b.endLocked(member, l)
		z = b.zones[l.tag]
	}
	b.mu.Unlock()
	switch {
	case l == nil:
	case ghost:
		b.poke()
	case send:
		z.send()
	}
}

// endLocked files a lease as ended, to be removed. mu must be held.
func (b *book) endLocked(member string, l *lease) {
	byMember := b.ended[l.tag]
	if byMember == nil {
		byMember = map[string]*lease{}
		b.ended[l.tag] = byMember
	}
	byMember[member] = l
}

// sending is the leases one script removes, by member.
type sending map[string]*lease

// claim returns up to scriptChunk leases of a zone's that ended and that
// no script is removing (ghosts aside: maintain removes those), and marks
// them sent: by an admission call, to remove before it checks the sets, or
// by a removal of their own (alone). An admission call also sends again
// the leases a removal of their own is sending: it may overtake it in
// Redis. The zone makes one admission call at a time, so this instance's
// releases are never late for its own next admission (a client that sends
// its next request as soon as it has a response): the release went in an
// earlier admission call, or goes in this one.
func (b *book) claim(tag string, alone bool) (entries, sending) {
	var e entries
	var ids sending // made for the first lease: most calls send none
	b.mu.Lock()
	defer b.mu.Unlock()
	for m, l := range b.ended[tag] {
		if l.ghost || l.sends > 0 && (alone || !l.alone) {
			continue
		}
		if len(e.keys)+len(l.sets) > scriptChunk {
			break
		}
		l.sends++
		l.alone, l.again = alone, false
		if ids == nil {
			ids = sending{}
		}
		ids[m] = l
		for _, set := range l.sets {
			e.add(set, m, l.units)
		}
	}
	return e, ids
}

// unclaimed reports whether a zone has leases to remove that no script is
// removing.
func (b *book) unclaimed(tag string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, l := range b.ended[tag] {
		if l.sends == 0 && !l.ghost {
			return true
		}
	}
	return false
}

// settle records how the script that removed a zone's leases sent ended:
// removed (ok), a lease is forgotten, unless a renewal wrote it back
// meanwhile (again) or it is a ghost (removed again on ticks); failed, it
// is sent again. The script counts out of each lease's sends even if the
// lease was forgotten meanwhile (another script removed it, or it
// expired): a renewal that wrote it may file it again (removeAgain), and a
// send counted for a script long over would keep every later one from
// sending it, leaving it in Redis for a whole lease.
func (b *book) settle(tag string, sent sending, ok bool) {
	b.mu.Lock()
	for m, l := range sent {
		l.sends--
		l.alone = l.alone && l.sends > 0
		if b.ended[tag][m] != l {
			continue // forgotten meanwhile
		}
		if ok && !l.again && !l.ghost {
			delete(b.ended[tag], m)
		}
	}
	if len(b.ended[tag]) == 0 {
		delete(b.ended, tag)
	}
	idle := len(b.ended) == 0 && len(b.leases) == 0
	b.mu.Unlock()
	if idle {
		b.poke() // the book may close
	}
}

// dropGhost records the member of an admission whose reply never came.
func (b *book) dropGhost(tag, member string, sets []string, units int64) {
	b.mu.Lock()
	b.endLocked(member, &lease{tag: tag, sets: sets, units: units, released: time.Now(), ghost: true})
	b.mu.Unlock()
	b.poke()
}

// enter counts a request in Acquire, opening the book again if it closed:
// Caddy cleans up an old config without waiting for its servers, so its
// handler may still get a request after the book lost its last user.
func (b *book) enter() {
	b.mu.Lock()
	if b.client == nil {
		b.open()
	}
	b.active++
	b.mu.Unlock()
}

// tryEnter counts in a dispatch or renewal, unless the book closed: then
// it has nothing to do.
func (b *book) tryEnter() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.client == nil {
		return false
	}
	b.active++
	return true
}

// exit counts out what enter or tryEnter counted in; the book may close
// once nothing needs it.
func (b *book) exit() {
	b.mu.Lock()
	b.active--
	idle := b.active == 0
	b.mu.Unlock()
	if idle {
		b.poke()
	}
}

// poke asks maintain to remove the leases released.
func (b *book) poke() {
	select {
	case b.work <- struct{}{}:
	default:
	}
}

// maintain removes the released leases when poked and on every tick, and
// closes the book once no config, lease or request in Acquire needs it.
func (b *book) maintain() {
	tick := time.NewTicker(b.lease / 3)
	defer tick.Stop()
	for {
		ticked := false
		select {
		case <-b.work:
		case <-tick.C:
			ticked = true
		}
		b.removeReleased(ticked)
		if b.closeIfUnused() {
			return
		}
	}
}

// renewLoop renews the leases held every lease/3, and at once when Redis
// answers again after an outage, until stop is closed; then it also removes
// at once the leases released meanwhile, which would otherwise hold their
// units until maintain's next tick.
func (b *book) renewLoop(stop chan struct{}) {
	tick := time.NewTicker(b.lease / 3)
	defer tick.Stop()
	for {
		again := false
		select {
		case <-stop:
			return
		case <-tick.C:
		case <-b.renewNow:
			again = true
		}
		if !b.tryEnter() {
			return
		}
		if b.renew() && again {
			b.rejoining.Store(false)
			b.signalBack()
		}
		if again {
			b.removeReleased(true)
		}
		b.exit()
	}
}

// closeIfUnused closes the book if nothing needs it any more. maintain is
// the only caller, so nothing else uses the client outside enter and exit.
func (b *book) closeIfUnused() bool {
	books.Lock()
	defer books.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.users > 0 || len(b.leases) > 0 || len(b.ended) > 0 || b.active > 0 {
		return false
	}
	if books.m[b.id] == b {
		delete(books.m, b.id)
	}
	close(b.stop)
	b.client.Close()
	b.client = nil
	return true
}

// renew writes every lease held with a new expiry, one script per zone (a
// cluster slot) and chunk, in one pipeline.
func (b *book) renew() bool {
	if g := b.renewGate.Load(); g != nil {
		<-*g
	}
	byZone := map[string]*entries{}
	renewed := map[string]*lease{}
	b.mu.Lock()
	for m, l := range b.leases {
		renewed[m] = l
		e := byZone[l.tag]
		if e == nil {
			e = &entries{}
			byZone[l.tag] = e
		}
		for _, set := range l.sets {
			e.add(set, m, l.units)
		}
	}
	b.mu.Unlock()
	if len(byZone) == 0 {
		return true
	}
	type script struct {
		tag string
		cmd *redis.Cmd
	}
	var scripts []script
	localDeadline := localMicros() + b.timeout.Microseconds()
	var sent int64
	ok := b.pipeline("renew", b.labels(slices.Collect(maps.Keys(byZone))), func(ctx context.Context, p redis.Pipeliner) error {
		deadlines := map[string]int64{}
		for tag := range byZone {
			d, err := b.deadline(ctx, tag, localDeadline)
			if err != nil {
				return err
			}
			deadlines[tag] = d
		}
		sent = localMicros()
		for tag, e := range byZone {
			for lo := 0; lo < len(e.keys); lo += scriptChunk {
				keys, leases := e.chunk(lo, min(lo+scriptChunk, len(e.keys)))
				args := append([]any{deadlines[tag], b.lease.Milliseconds()}, leases...)
				scripts = append(scripts, script{tag, renewScript.Eval(ctx, p, keys, args...)})
			}
		}
		return nil
	})
	for _, s := range scripts {
		reply, err := s.cmd.Int64Slice()
		b.learnClock(s.tag, reply, err, sent)
	}
	b.removeAgain(renewed, !ok)
	return ok
}

// removeAgain files for removal, once more, the leases released while a
// renewal that wrote them was under way: their removal may have reached
// Redis before the renewal did. If the renewal failed (no reply within
// timeout), its scripts may still run later: every lease it wrote is then
// removed as a ghost once released.
func (b *book) removeAgain(renewed map[string]*lease, failed bool) {
	ghosts := false
	var zones []*redisZone
	b.mu.Lock()
	for m, l := range renewed {
		l.unsure = l.unsure || failed
		if b.leases[m] == l {
			continue // still held
		}
		l.again = true
		l.ghost = l.ghost || failed
		b.endLocked(m, l)
		if z := b.zones[l.tag]; !l.ghost && !slices.Contains(zones, z) {
			zones = append(zones, z)
		}
		ghosts = ghosts || l.ghost
	}
	b.mu.Unlock()
	for _, z := range zones {
		z.send()
	}
	if ghosts {
		b.poke()
	}
}

// removeReleased removes ghosts, at once and again on ticks, and on ticks
// the leases of ended requests that the zones' calls have not removed
// within timeout (Redis failed, or no call came), one script per zone and
// chunk, in one pipeline. A lease is forgotten once removed, or once it
// has expired anyway. A ghost is removed again on ticks until it would
// have expired: a script that may write it has a deadline at most timeout
// after the ghost was filed, and the lease it writes lives for lease from
// then.
func (b *book) removeReleased(ticked bool) {
	type batch struct {
		entries
		sent sending
	}
	byZone := map[string]*batch{}
	now := time.Now()
	b.mu.Lock()
	for tag, byMember := range b.ended {
		for m, l := range byMember {
			lives := b.lease
			if l.ghost {
				lives += b.timeout
			}
			switch {
			case now.Sub(l.released) > lives:
				delete(byMember, m) // expired in Redis by now
				continue
			case l.sends > 0:
				continue
			case l.ghost && l.tried && !ticked:
				continue
			case !l.ghost && (!ticked || now.Sub(l.released) < b.timeout):
				continue // the zone's next call removes it
			}
			l.again, l.tried = false, l.ghost
			l.sends++
			e := byZone[tag]
			if e == nil {
				e = &batch{sent: sending{}}
				byZone[tag] = e
			}
			e.sent[m] = l
			for _, set := range l.sets {
				e.add(set, m, l.units)
			}
		}
		if len(byMember) == 0 {
			delete(b.ended, tag)
		}
	}
	b.mu.Unlock()
	if len(byZone) == 0 {
		return
	}
	ok := b.pipeline("release", b.labels(slices.Collect(maps.Keys(byZone))), func(ctx context.Context, p redis.Pipeliner) error {
		for tag, e := range byZone {
			waiting := []string{tag + ":waiting"}
			for lo := 0; lo < len(e.keys); lo += scriptChunk {
				keys, leases := e.chunk(lo, min(lo+scriptChunk, len(e.keys)))
				releaseScript.Eval(ctx, p, append(waiting, keys...), append([]any{tag + ":released"}, leases...)...)
			}
		}
		return nil
	})
	for tag, e := range byZone {
		b.settle(tag, e.sent, ok) // failed: retried on the next tick
	}
}

// pipeline runs fill's scripts in one round trip and reports whether all
// succeeded. Scripts go with their source: a pipeline cannot fall back
// from a hash Redis does not know. fill may call Redis first, within the
// same timeout; its error fails the pipeline.
func (b *book) pipeline(op string, zones []string, fill func(context.Context, redis.Pipeliner) error) bool {
	ctx, cancel := context.WithTimeout(storeContext, b.timeout)
	defer cancel()
	start := time.Now()
	cmds, err := b.client.Pipelined(ctx, func(p redis.Pipeliner) error { return fill(ctx, p) })
	// Renewals and releases can run again. One that met a pooled connection
	// Redis or the network had closed (go-redis drops it) tries the next
	// one, a few times: that is not an outage (seen: a release after Redis
	// answered again logged a second outage).
	for try := 1; try < 3 && staleConnection(err); try++ {
		cmds, err = b.client.Pipelined(ctx, func(p redis.Pipeliner) error { return fill(ctx, p) })
	}
	if err == nil {
		for _, c := range cmds {
			if c.Err() != nil {
				err = asLate(c.Err())
				break
			}
		}
	}
	b.observe(op, zones, start, err)
	return err == nil
}

// listen wakes a zone's waiters when any instance releases one of its
// slots, until stop is closed.
func (b *book) listen(client redis.UniversalClient, stop chan struct{}) {
	pubsub := client.PSubscribe(storeContext, b.prefix+":"+keySchema+":{*}:released")
	defer pubsub.Close()
	messages := pubsub.Channel()
	for {
		select {
		case <-stop:
			return
		case m, ok := <-messages:
			if !ok {
				return
			}
			b.mu.Lock()
			z := b.zones[strings.TrimSuffix(m.Channel, ":released")]
			b.mu.Unlock()
			if z != nil {
				z.queue.Wake()
			}
		}
	}
}

// available reports whether Redis is worth trying: after a failure it is
// left alone for a second, so requests do not each wait out a timeout,
// or until the prober (probe.go) has an answer, if sooner; then until
// every lease is written back (rejoining), so that Redis, which may have
// lost them (a restart, a failover), counts what this instance holds
// before it admits more.
func (b *book) available() bool {
	return !b.rejoining.Load() && time.Now().UnixNano() >= b.downUntil.Load()
}

// whenBack returns a channel closed once Redis is available again, for a
// request that waits alone meanwhile (see fallback).
func (b *book) whenBack() <-chan struct{} {
	for {
		p := b.back.Load()
		if p == nil {
			ch := make(chan struct{})
			if !b.back.CompareAndSwap(nil, &ch) {
				continue
			}
			p = &ch
		}
		b.signalBack() // it may be back already
		return *p
	}
}

// signalBack closes the channel whenBack gave, if Redis is available. It
// runs after every answer: one atomic load while nobody waits alone.
func (b *book) signalBack() {
	if p := b.back.Load(); p != nil && b.available() && b.back.CompareAndSwap(p, nil) {
		close(*p)
	}
}

// observe records an operation's latency and outcome in the metrics of
// each zone it served, and logs when Redis becomes unreachable and when it
// is reachable again; then every lease is written back at once, whatever
// Redis lost meanwhile.
func (b *book) observe(op string, zones []string, start time.Time, err error) {
	failed := err != nil && err != redis.Nil
	took := time.Since(start)
	for _, zone := range zones {
		storestatus.Observe("redis", zone, op, took, failed)
	}
	if !failed {
		b.answered.Store(time.Now().UnixNano())
		ended := b.outage.CompareAndSwap(true, false)
		if ended {
			b.rejoining.Store(true) // before downUntil: no request slips in between
		}
		if b.downUntil.Load() != 0 {
			b.downUntil.Store(0)
		}
		if ended {
			b.outageLog.up()
			select {
			case b.renewNow <- struct{}{}:
			default:
			}
		}
		b.signalBack()
		return
	}
	b.downUntil.Store(time.Now().Add(backOff).UnixNano())
	b.probe()
	// A call sent before Redis last answered is the tail of an outage just
	// over (or a wait for a connection), not a new one; Redis is still
	// left alone until it answers again.
	starts := start.UnixNano() >= b.answered.Load() && b.outage.CompareAndSwap(false, true)
	b.outageLog.failed(op, starts, zap.String("op", op), zap.Strings("zones", zones),
		zap.String("reason", b.failure.cause(err)), zap.Error(err))
}

func randomID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// staleConnection reports whether err is a connection that was closed
// under the call (EOF, reset, broken pipe), rather than Redis failing to
// answer or to be reached.
func staleConnection(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}
