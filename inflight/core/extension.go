package core

import "sync"

// An Extension is what an edge keeps per zone beside its counts: made by
// the first of the zone's gates that asks for it, shared by them all, and
// kept as long as the zone, across reloads. The HTTP edge keeps there the
// usage its LLM requests report and the output estimates it learns from
// them (package llm).
type Extension interface {
	// State is what the admin API shows of it as the zone's "usage",
	// while the zone's units have costs; nil shows none.
	State() any
}

// extensionSlot holds a zone's extension, once made.
type extensionSlot struct {
	mu sync.Mutex
	x  Extension
}

// get returns the extension, nil before one is made.
func (s *extensionSlot) get() Extension {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.x
}

// Extension returns the extension of the gate's zone, made by newExt if
// the zone has none yet.
func (g *Gate) Extension(newExt func() Extension) Extension {
	s := &g.zone.extension
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.x == nil {
		s.x = newExt()
	}
	return s.x
}

// EachExtension calls fn with the name and the extension of every zone in
// use that has one, retired zones aside, for the edge's metrics.
func EachExtension(fn func(zone string, x Extension)) {
	eachZone(func(z *zone, retired bool) {
		if x := z.extension.get(); x != nil && !retired {
			fn(z.label, x)
		}
	})
}
