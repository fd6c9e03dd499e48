package core

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// zones holds every zone in use, shared across config generations: a reload
// provisions the new handlers (taking a reference) before it cleans up the
// old ones (dropping theirs), so a zone's counts outlive the reload and the
// requests still in flight keep counting against the new config.
var zones = caddy.NewUsagePool()

// zone is a limiter.Zone with the names metrics and logs show.
type zone struct {
	*limiter.Zone
	id     string   // identity: name and shape (zoneID)
	label  string   // the zone's name, as named or automatic
	limits []string // dimension names
	series keySeries
	// keyDisplay is how per-key metrics and the admin API show keys
	// (keysAnonymous, keysHashed, keysPlain).
	keyDisplay atomic.Int32
	// adaptive is the adaptive total's controller, if a handler has one.
	adaptive adaptiveState
	// view and stats are what the admin API shows besides the counts.
	view  atomic.Pointer[zoneView]
	stats zoneStats
	units unitStats
	// grants is the rate of its releases, counted by the handlers with
	// early refusal or retry hints (see grantRate), and retries the times
	// its retry hints told (see RetryHint).
	grants  grantRate
	retries retrySchedule
	// extension is what an edge keeps with the zone (Extension).
	extension extensionSlot
	// ledger keeps the zone's counts for a fleet, if it has a store, and
	// through is what the engine asks: ledger, put behind it again by a
	// reload that changed the store's options. Guarded by ledgerMu.
	ledgerMu sync.Mutex
	ledger   limiter.Ledger
	through  *ledgerSwitch
}

// useLedger makes l the zone's ledger, and closes the one it replaces
// (a reload that changed the store's options).
func (z *zone) useLedger(l limiter.Ledger) {
	z.ledgerMu.Lock()
	old, first := z.ledger, z.through == nil
	if old == l {
		z.ledgerMu.Unlock()
		return
	}
	z.ledger = l
	if first {
		z.through = &ledgerSwitch{}
	}
	z.through.put(l)
	z.ledgerMu.Unlock()
	if first {
		z.SetLedger(z.through)
	}
	if c, ok := old.(io.Closer); ok {
		c.Close()
	}
}

// currentLedger returns the zone's ledger, nil without a store.
func (z *zone) currentLedger() limiter.Ledger {
	z.ledgerMu.Lock()
	defer z.ledgerMu.Unlock()
	return z.ledger
}

// waiting returns the requests waiting in this zone.
func (z *zone) waiting() int64 { return z.State(limiter.Look{}).Waiting }

// idle reports whether the zone has no request in flight or waiting. A
// closed zone's idle allowance that Redis did not hear of (it could not
// answer) lapses there with its lease.
func (z *zone) idle() bool {
	st := z.State(limiter.Look{Dims: true})
	if st.Waiting > 0 || st.Total.Units > 0 {
		return false
	}
	for _, ds := range st.Dims {
		if ds.Units > 0 {
			return false
		}
	}
	return true
}

// zoneID identifies a zone by its name, named or automatic, and its shape
// (limit names and keys, and whether it has a total). Maxes are not part of
// the identity, so an edited max keeps the counts.
func zoneID(label string, named bool, limits []Limit, hasTotal bool) string {
	var b strings.Builder
	if !named {
		b.WriteString("\x01") // an automatic name never equals a zone's name
	}
	b.WriteString(label)
	for _, l := range limits {
		fmt.Fprintf(&b, "\x00%s=%s", l.Name, l.Key)
	}
	if hasTotal {
		b.WriteString("\x00+total")
	}
	return b.String()
}

// describeShape writes a zone's limits for an error message.
func describeShape(limits []Limit, hasTotal bool, show func(string) string) string {
	parts := make([]string, 0, len(limits)+1)
	for _, l := range limits {
		parts = append(parts, l.Name+" "+show(l.Key))
	}
	if hasTotal {
		parts = append(parts, "total")
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// claims records, per named zone, the shape it was given in the config
// being loaded, so that two handlers of one config cannot give one zone two
// different sets of limits. A new config may change the shape.
var claims = struct {
	sync.Mutex
	m map[string]claim
}{m: map[string]claim{}}

type claim struct {
	config any // identifies the config load
	id     string
	shape  string
}

func claimZone(config any, name, id, shape string) error {
	if name == "" || config == nil {
		return nil
	}
	claims.Lock()
	defer claims.Unlock()
	if c, ok := claims.m[name]; ok && c.config == config && c.id != id {
		return fmt.Errorf("zone %q is used with limits %s and %s: handlers that share a zone need the same limits (names and keys); give one of them another zone name", name, c.shape, shape)
	}
	claims.m[name] = claim{config: config, id: id, shape: shape}
	return nil
}

// fleetID names a zone and its shape in a shared store, the same on every
// instance with the same config: the zone's name and a hash of its identity.
func fleetID(label, id string) string {
	sum := sha256.Sum256([]byte(id))
	return label + "/" + hex.EncodeToString(sum[:6])
}

func names(limits []Limit) []string {
	out := make([]string, len(limits))
	for i, l := range limits {
		out[i] = l.Name
	}
	return out
}

// loadZone takes a reference to the zone for id, making it if it is new
// (or taking it back from the retired zones).
func loadZone(id, label string, limits []Limit, hasTotal bool) (*zone, error) {
	v, _, err := zones.LoadOrNew(id, func() (caddy.Destructor, error) {
		if z := takeRetired(id); z != nil {
			z.Reopen()
			return z, nil
		}
		return &zone{Zone: limiter.NewZone(len(limits), hasTotal, nil), id: id, label: label, limits: names(limits)}, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*zone), nil
}

// anonymous numbers the unnamed handlers of the config being loaded, per
// site. Loads do not overlap, so one count serves the current load.
var anonymous = struct {
	sync.Mutex
	config any
	seen   map[string]int
}{}

// numberedZone returns the name of the next unnamed handler of site in the
// config being loaded.
func numberedZone(ctx caddy.Context, site string) string {
	anonymous.Lock()
	defer anonymous.Unlock()
	if config := ctx.GetMetricsRegistry(); anonymous.config != config || config == nil {
		anonymous.config, anonymous.seen = config, map[string]int{}
	}
	anonymous.seen[site]++
	return site + "#" + strconv.Itoa(anonymous.seen[site])
}
