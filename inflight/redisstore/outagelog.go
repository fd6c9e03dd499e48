package redisstore

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// outageQuiet is how long Redis must answer with no failure before an
// outage is logged as over: a failure sooner continues the logged outage
// (connections that flap, a restart that breaks the pool twice), and the
// closing line counts it in "flaps". It is the store's back-off: as long
// as one failure would have left Redis alone without the prober.
const outageQuiet = backOff

// outageLog writes one pair of lines per outage, however often the
// connections fail and recover within it: "unreachable" at the first
// failure, "reachable again" once Redis has answered for quiet since its
// latest recovery; and, between them, the first failure of each other
// operation, so that every failure counted in the metrics has a line that
// says why. Only the log is debounced: the book rejoins at the first
// answer (observe), and Health says so at once.
type outageLog struct {
	logger *zap.Logger
	quiet  time.Duration

	mu        sync.Mutex
	open      bool            // "unreachable" logged, "reachable again" not yet
	explained map[string]bool // the operations whose failure the open outage logged
	began     time.Time       // the first failure of the open outage
	answered  time.Time       // its latest recovery
	flaps     int             // failures after a recovery within it
	closing   *time.Timer     // logs it as over after quiet, unless stopped
	gen       int             // counts the timers set, so a stale one logs nothing
}

// failed logs a failure of op: as the start of an outage, if starts says
// it ends a time Redis answered (not the tail of an outage) and no outage
// is open; otherwise as the first failure of op in the open outage, if it
// is. A failure that starts within quiet of a recovery is a flap.
func (o *outageLog) failed(op string, starts bool, fields ...zap.Field) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if starts && o.closing != nil {
		o.closing.Stop()
		o.closing, o.gen = nil, o.gen+1
		o.flaps++
	}
	if starts && !o.open {
		o.open, o.began, o.flaps = true, time.Now(), 0
		o.explained = map[string]bool{op: true}
		o.logger.Error("redis store unreachable", fields...)
		return
	}
	if o.explained != nil && !o.explained[op] {
		o.explained[op] = true
		o.logger.Warn("redis store operation failed", fields...)
	}
}

// up records that Redis answered after a failure: the outage is logged as
// over after quiet, unless a failure comes first.
func (o *outageLog) up() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.open {
		return
	}
	o.answered = time.Now()
	if o.closing != nil {
		o.closing.Stop()
	}
	o.gen++
	gen := o.gen
	o.closing = time.AfterFunc(o.quiet, func() { o.close(gen) })
}

// close logs the open outage as over, if the timer of generation gen is
// still the one set: no failure or later recovery came since.
func (o *outageLog) close(gen int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closing == nil || o.gen != gen {
		return
	}
	o.open, o.closing = false, nil
	o.logger.Info("redis store reachable again", zap.Duration("down", o.answered.Sub(o.began)), zap.Int("flaps", o.flaps))
}
