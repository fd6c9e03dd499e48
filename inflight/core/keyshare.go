package core

import "time"

// A key's share of what the backend gave recently: the unit-seconds its
// requests held (units × the time from admission to release), over the
// requests that ended in the last one to two minutes, beside those of
// every key of its limit; shown with per_key_metrics for the keys with
// requests waiting, beside their weight under fair.

// givenWindow sums unit-seconds over two steps of waitWindowStep, as
// waitWindow counts waits. Every window steps at the same instants (steps
// counted from processStart), so a key's and its limit's cover the same
// time and the shares of a limit's keys add up to 1. Guarded by its
// keySeries' mu.
type givenWindow struct {
	cur, prev float64
	step      int64 // of cur
}

func (w *givenWindow) add(now int64, unitSeconds float64) {
	w.roll(now)
	w.cur += unitSeconds
}

func (w *givenWindow) sum(now int64) float64 {
	w.roll(now)
	return w.cur + w.prev
}

// roll moves w on to the step of now (nanotime).
func (w *givenWindow) roll(now int64) {
	step := now / int64(waitWindowStep)
	switch step - w.step {
	case 0:
		return
	case 1:
		w.prev = w.cur
	default:
		w.prev = 0
	}
	w.cur, w.step = 0, step
}

// limitGiven returns the window of the limit's keys together. mu must be
// held.
func (k *keySeries) limitGiven(limit string) *givenWindow {
	w := k.given[limit]
	if w == nil {
		if k.given == nil {
			k.given = map[string]*givenWindow{}
		}
		w = new(givenWindow)
		k.given[limit] = w
	}
	return w
}

// recentShare returns a key's share of its limit's unit-seconds given
// recently (nil if its limit gave none, or the key is not tracked) and its
// weight under fair (0 in other limits).
func (k *keySeries) recentShare(limit, key string, now int64) (*float64, float64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	s, all := k.keys[seriesKey{limit, key}], k.given[limit]
	if s == nil || all == nil {
		return nil, 0
	}
	total := all.sum(now)
	if total <= 0 {
		return nil, s.weight
	}
	share := s.given.sum(now) / total
	return &share, s.weight
}

// processStart is what nanotime counts from.
var processStart = time.Now()

// nanotime is the monotonic clock in nanoseconds since the process
// started: a Ticket keeps its admission in 8 bytes.
func nanotime() int64 { return int64(time.Since(processStart)) }
