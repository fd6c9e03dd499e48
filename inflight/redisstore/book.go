package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-inflight/caddy-inflight/inflight/storestatus"
)

// books holds the book of every Redis setup in use, by a hash of its
// options. A reload that keeps the options keeps the book; one that changes
// them makes a new book, and the old one lives until the zones that use it
// have given back what they hold.
var books = struct {
	sync.Mutex
	m map[string]*book
}{m: map[string]*book{}}

// keySchema names the layout of a zone's keys (allowances and reports,
// see scripts.go), after the key prefix: instances that count otherwise
// (leases per request, u2, until 2026-12-05) use other keys, so a fleet
// halfway through an upgrade counts in two groups rather than misreading
// each other's keys.
const keySchema = "a1"

// book is the client of one Redis setup, shared by every zone's ledger on
// it, with what they share: the instance's name in Redis, the outage state
// and its log, the scripts' clocks, and the subscription to the zones'
// notices.
type book struct {
	id       string
	options  *redis.UniversalOptions
	lease    time.Duration
	timeout  time.Duration
	failure  failure // what the settings tell of a failure's cause
	prefix   string
	closed   bool   // on_error closed
	instance string // this process in Redis (see processName)

	users   int // configs using the book; guarded by books
	mu      sync.Mutex
	ledgers map[string]*ledger     // by zone tag
	clocks  map[string]*redisClock // by zone tag: see clock.go
	asking  sync.Mutex             // held while Redis is asked a zone's clock
	// client is nil while the book is closed. It is opened and closed
	// under mu, and closed only while active is 0: a goroutine between
	// enter (or tryEnter) and exit uses it without the lock.
	client redis.UniversalClient
	active int           // calls and probes under way
	stop   chan struct{} // closed with the client
	// subscribed is closed once the subscription to the notices is in
	// place (or failed): a zone's ledger waits for it, so that the first
	// notices are not missed.
	subscribed chan struct{}

	downUntil atomic.Int64  // unix nanos until which Redis is not tried; 0 once it answered
	probing   atomic.Bool   // the prober runs (see probe.go)
	outage    atomic.Bool   // from a failure until Redis answers
	epoch     atomic.Uint64 // counts the outages that ended (see ledger.Epoch)
	outageLog outageLog     // what the log says of outages (debounced)
	answered  atomic.Int64  // unix nanos of Redis's latest answer
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
	b.closeIfUnused()
}

func newBook(s *Store, id string) *book {
	b := &book{
		id:        id,
		options:   s.redisOptions(),
		lease:     time.Duration(s.Lease),
		timeout:   time.Duration(s.Timeout),
		failure:   s.failure(),
		prefix:    s.KeyPrefix,
		closed:    s.OnError == "closed",
		instance:  processName,
		ledgers:   map[string]*ledger{},
		clocks:    map[string]*redisClock{},
		outageLog: outageLog{logger: s.logger, quiet: outageQuiet},
	}
	b.open()
	return b
}

// open starts the client and the subscription. mu must be held (or b not
// yet shared).
func (b *book) open() {
	b.client = redis.NewUniversalClient(b.options)
	b.stop = make(chan struct{})
	b.subscribed = make(chan struct{})
	go b.listen(b.client, b.stop, b.subscribed)
}

// ledger returns the ledger of one zone: id names the zone and its shape,
// so the whole fleet uses the same keys for the same limits.
func (b *book) ledger(id string) *ledger {
	b.mu.Lock()
	defer b.mu.Unlock()
	// The braces are a Redis Cluster hash tag: all of a zone's keys live in
	// one slot, as the script needs. key_prefix has no braces (Validate).
	tag := b.prefix + ":" + keySchema + ":{" + id + "}"
	if l := b.ledgers[tag]; l != nil {
		return l // the zone's, kept by a reload that kept the options
	}
	l := &ledger{book: b, tag: tag, label: zoneLabel(id), changed: make(chan struct{}, 1)}
	b.ledgers[tag] = l
	if b.client == nil {
		b.open()
	}
	subscribed := b.subscribed
	b.mu.Unlock()
	select {
	case <-subscribed:
	case <-time.After(b.timeout):
	}
	b.mu.Lock()
	return l
}

// dropLedger forgets a ledger no zone uses any more; the book may close.
func (b *book) dropLedger(l *ledger) {
	b.mu.Lock()
	if b.ledgers[l.tag] == l {
		delete(b.ledgers, l.tag)
	}
	b.mu.Unlock()
	b.closeIfUnused()
}

// zoneLabel is the zone's name in metrics and logs: its id less the hash
// of its shape.
func zoneLabel(id string) string {
	if i := strings.LastIndex(id, "/"); i > 0 {
		return id[:i]
	}
	return id
}

// enter counts a call in, opening the book again if it closed: Caddy
// cleans up an old config without waiting for its servers, so a zone of
// it may still call after the book lost its last user.
func (b *book) enter() {
	b.mu.Lock()
	if b.client == nil {
		b.open()
	}
	b.active++
	b.mu.Unlock()
}

// tryEnter counts in a probe, unless the book closed: then it has nothing
// to do.
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
		b.closeIfUnused()
	}
}

// closeIfUnused closes the book's client if no config, zone or call needs
// it any more.
func (b *book) closeIfUnused() {
	books.Lock()
	defer books.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.users > 0 || len(b.ledgers) > 0 || b.active > 0 || b.client == nil {
		return
	}
	if books.m[b.id] == b {
		delete(books.m, b.id)
	}
	close(b.stop)
	b.client.Close()
	b.client = nil
}

// listen hands the zones' notices to their ledgers, until stop is closed;
// it closes subscribed once the subscription is in place, or failed.
func (b *book) listen(client redis.UniversalClient, stop, subscribed chan struct{}) {
	pubsub := client.PSubscribe(storeContext, b.prefix+":"+keySchema+":{*}:n")
	defer pubsub.Close()
	ctx, cancel := context.WithTimeout(storeContext, b.timeout)
	pubsub.Receive(ctx) // the confirmation; go-redis subscribes again after a failure
	cancel()
	close(subscribed)
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
			l := b.ledgers[strings.TrimSuffix(m.Channel, ":n")]
			b.mu.Unlock()
			if l != nil {
				l.notice(m.Payload)
			}
		}
	}
}

// available reports whether Redis is worth trying: after a failure it is
// left alone for a second, so requests do not each wait out a timeout,
// or until the prober (probe.go) has an answer, if sooner.
func (b *book) available() bool {
	return time.Now().UnixNano() >= b.downUntil.Load()
}

// observe records an operation's latency and outcome in the metrics of
// each zone it served, and logs when Redis becomes unreachable and when it
// is reachable again; then every zone writes all it holds again (a new
// epoch), whatever Redis lost meanwhile.
func (b *book) observe(op string, zones []string, start time.Time, err error) {
	failed := err != nil && err != redis.Nil
	took := time.Since(start)
	for _, zone := range zones {
		storestatus.Observe("redis", zone, op, took, failed)
	}
	if !failed {
		b.answered.Store(time.Now().UnixNano())
		if b.downUntil.Load() != 0 {
			b.downUntil.Store(0)
		}
		if b.outage.CompareAndSwap(true, false) {
			b.epoch.Add(1)
			b.outageLog.up()
			b.mu.Lock()
			for _, l := range b.ledgers {
				l.signal()
			}
			b.mu.Unlock()
		}
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

// processName names this process in Redis, the same for every book: a
// reload that changes a store's options (a new book) writes the zones'
// allowances again under the same name, over what the old book wrote.
var processName = randomID()

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
