package core

import (
	"sync"
	"sync/atomic"
)

// BadValues logs the bad values of templates (max, weight, cost) once
// each, for the first 1000 values.
type BadValues struct {
	seen sync.Map
	n    atomic.Int32
}

// Log calls log once per distinct bad value v of a template of kind, and
// returns the value as logs show it. The value may come from a client (a
// header): only its hash is shown.
func (b *BadValues) Log(kind, v string, log func(seen string)) string {
	seen := redact(v)
	if v == "" {
		seen = "empty"
	}
	if b.n.Load() < 1000 {
		if _, logged := b.seen.LoadOrStore(kind+" "+seen, true); !logged {
			b.n.Add(1)
			log(seen)
		}
	}
	return seen
}
