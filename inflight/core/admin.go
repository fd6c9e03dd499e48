package core

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

func init() {
	caddy.RegisterModule(new(AdminAPI))
}

// topKeys is how many keys per zone the admin API lists.
const topKeys = 10

// AdminAPI serves the live state of every zone at `GET /inflight/` on
// Caddy's admin endpoint: per zone, its limits with the requests and units
// held and keys in flight against their caps, the total, the requests and
// units waiting, the costs admitted, refusals by reason, recent wait
// percentiles, the adaptive limit, the store's health, and the keys
// holding the most units. It answers "who is holding
// my backend right now?". `GET /inflight/ui` is the same state as a live
// page (see UI).
type AdminAPI struct{}

// CaddyModule returns the Caddy module information.
func (*AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.inflight",
		New: func() caddy.Module { return new(AdminAPI) },
	}
}

// Routes returns the admin routes.
func (a *AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/inflight/", Handler: caddy.AdminHandlerFunc(a.serve)}}
}

// serve answers the state at /inflight/ (and /inflight/state, where the
// page looks for it) and the page's files; any other path is not found.
func (a *AdminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method not allowed")}
	}
	switch name := strings.TrimPrefix(r.URL.Path, "/inflight/"); name {
	case "", StateFile:
		return ServeState(w)
	case PageFile, ScriptFile, StyleFile:
		ServePageFile(w, name)
		return nil
	}
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("not found: %s (the inflight admin API serves /inflight/ and /inflight/ui)", r.URL.Path)}
}

// ZoneState is one zone in the admin API's answer.
type ZoneState struct {
	Zone   string       `json:"zone"`
	Limits []LimitState `json:"limits"`
	// Total is the requests in flight in the zone, with a total cap, and
	// TotalUnits the units they hold.
	Total      *int64 `json:"total,omitempty"`
	TotalUnits *int64 `json:"total_units,omitempty"`
	// TotalMax is the total's cap in units: the fixed total, or the
	// adaptive total's current limit (absent in dry_run).
	TotalMax *int64 `json:"total_max,omitempty"`
	// Waiting is the requests waiting, and WaitingUnits the units they
	// ask for.
	Waiting      int64 `json:"waiting"`
	WaitingUnits int64 `json:"waiting_units"`
	// Cost sums up the costs of the requests the zone admitted, when its
	// requests have costs (cost, cost_tokens); absent when each holds
	// one unit, and units are requests.
	Cost *CostState `json:"cost,omitempty"`
	// Usage sums up the tokens models reported against the estimates,
	// for requests with cost tokens that reported theirs, and gives the
	// output estimate with default_output auto (llm.UsageState).
	Usage any `json:"usage,omitempty"`
	// Refused counts the zone's refusals by reason (full, timeout,
	// queue_full, keys_full, store_error, dry_run) since it was made;
	// reasons with none are left out.
	Refused map[string]int64 `json:"refused"`
	// Wait sums up the waits that ended in the last one to two minutes.
	Wait WaitState `json:"wait"`
	// Adaptive is the adaptive total's limit and what it learned, with
	// total_adaptive.
	Adaptive *AdaptiveState `json:"adaptive,omitempty"`
	// Store is the shared store's health, with a store.
	Store *StoreHealth `json:"store,omitempty"`
	// Retired is set on a zone that no loaded config uses any more (a
	// reload renamed it or changed its limits) while requests it admitted
	// or queued are still running; it is listed until they end.
	Retired bool `json:"retired,omitempty"`
	// TopKeys are the keys holding the most units (held: their units).
	// With per_key_metrics
	// they are the hashes logs and metrics show (raw with plain_keys);
	// otherwise anonymous (#-prefixed), as the engine keeps only a keyed
	// hash of each key.
	TopKeys []keyInFlight `json:"top_keys"`
	// TopWaiting are the keys with the most requests waiting, shown as
	// TopKeys shows keys; with per_key_metrics, each with the percentiles
	// of its waits that ended recently.
	TopWaiting []keyWaiting `json:"top_waiting"`
}

// LimitState is one limit of a zone.
type LimitState struct {
	Name string `json:"name"`
	// Requests is the requests in flight, summed over keys, and Units the
	// units they hold (a request holds its cost, 1 by default).
	Requests int64 `json:"held"`
	Units    int64 `json:"units"`
	Keys     int   `json:"keys"`
	// Max is the limit's cap per key in units as configured (each of n replicas
	// enforces ceil(max/n) alone); absent when each request brings its
	// own (a placeholder).
	Max int64 `json:"max,omitempty"`
}

type keyInFlight struct {
	Limit    string `json:"limit"`
	Key      string `json:"key"`
	InFlight int64  `json:"held"` // units
}

// ServeState writes every zone's state as JSON.
func ServeState(w http.ResponseWriter) error {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	return json.NewEncoder(w).Encode(map[string]any{"zones": States()})
}

// States returns every zone's state, by zone name.
func States() []ZoneState {
	states := []ZoneState{}
	eachZone(func(z *zone, retired bool) {
		st := stateOf(z)
		st.Retired = retired
		states = append(states, st)
	})
	slices.SortFunc(states, func(a, b ZoneState) int { return cmp.Compare(a.Zone, b.Zone) })
	return states
}

func stateOf(z *zone) ZoneState {
	named := z.series.top(topKeys)
	look := limiter.Look{Dims: true, WaitingKeys: true}
	if len(named) == 0 {
		look.Top = topKeys
	}
	zs := z.State(look)
	st := ZoneState{Zone: z.label, Waiting: zs.Waiting, WaitingUnits: z.units.waiting.Load(), Limits: []LimitState{}, TopKeys: named}
	for d, name := range z.limits {
		ds := zs.Dims[d]
		st.Limits = append(st.Limits, LimitState{Name: name, Requests: ds.Requests, Units: ds.Units, Keys: ds.Keys})
	}
	if zs.HasTotal {
		st.Total, st.TotalUnits = &zs.Total.Requests, &zs.Total.Units
	}
	if len(st.TopKeys) == 0 {
		var anon []keyInFlight
		for d, name := range z.limits {
			for _, kc := range zs.Dims[d].Top {
				anon = append(anon, keyInFlight{Limit: name, Key: fmt.Sprintf("#%016x", kc.Hash), InFlight: kc.Count})
			}
		}
		st.TopKeys = topN(anon, topKeys)
	}
	now := time.Now()
	waits := z.waitingKeys(zs)
	z.sweepKeyWaits(now, waits)
	st.TopWaiting = waits[:min(topKeys, len(waits))]
	if st.TopWaiting == nil {
		st.TopWaiting = []keyWaiting{}
	}
	step := nanotime() // one instant for every key's share
	for i, kw := range st.TopWaiting {
		st.TopWaiting[i].Wait = z.series.recentWait(kw.Limit, kw.Key, now)
		st.TopWaiting[i].Share, st.TopWaiting[i].Weight = z.series.recentShare(kw.Limit, kw.Key, step)
	}
	extendState(&st, z)
	return st
}

// topN sorts keys by units held, most first, and keeps n.
func topN(keys []keyInFlight, n int) []keyInFlight {
	slices.SortFunc(keys, func(a, b keyInFlight) int { return cmp.Compare(b.InFlight, a.InFlight) })
	if keys == nil {
		keys = []keyInFlight{}
	}
	return keys[:min(n, len(keys))]
}

// Interface guard
var _ caddy.AdminRouter = (*AdminAPI)(nil)
