// Package layer4 is the caddy-l4 connection handler `inflight`
// (layer4.handlers.inflight): it caps the connections one client, or any
// key of a connection, may have open at once, with the engine, zones,
// metrics and admin API of the HTTP handler `inflight`. It is a module of
// its own, so that builds without caddy-l4 never compile it:
//
//	xcaddy build --with github.com/mholt/caddy-l4 --with github.com/caddy-inflight/caddy-inflight/layer4
package layer4

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/mholt/caddy-l4/layer4"
	"go.uber.org/zap"

	"github.com/caddy-inflight/caddy-inflight/inflight"
	_ "github.com/caddy-inflight/caddy-inflight/inflight/redisstore"
)

func init() {
	caddy.RegisterModule(new(Handler))
}

// Handler caps the connections in flight per key. A connection takes one
// slot in every limit (and the total) when it reaches the handler, or none
// if any of them is full, and holds them until it is closed, however it
// ends: closed by either side, reset, timed out, or handed to the HTTP
// server by the layer4 listener wrapper (then its slots go back when the
// HTTP server closes it).
//
// A connection over a cap is closed at once, or, with `wait`, held unread
// until a slot frees. Every refusal is counted in the metrics and the
// admin API, logged at debug level and emitted as the event
// `inflight_refused`, as the HTTP handler's are.
type Handler struct {
	// Limits are the dimensions a connection must fit in, all of them, to
	// be admitted. Keys are placeholder templates of the layer4 app, and
	// `{l4.conn.remote_ip}`: the client's IP address, without the port
	// (after a proxy_protocol handler, the address it carried), as a
	// prefix with KeyPrefix. Maxes are fixed positive integers.
	Limits []inflight.Limit `json:"limits,omitempty"`

	// Total caps the connections in flight through this handler (its zone)
	// across all keys. 0 means no total cap.
	Total int `json:"total,omitempty"`

	// Zone names the counters: handlers with the same zone share them,
	// HTTP handlers included, and must have the same limits. A handler
	// without a zone has counters of its own, in a zone named after its
	// server's listen addresses and its position among the server's
	// unnamed inflight handlers (`layer4 :5432#1`; in a listener wrapper,
	// the HTTP server's). Counts carry over a reload either way.
	Zone string `json:"zone,omitempty"`

	// KeyPrefix makes `{l4.conn.remote_ip}` the client's network, so that
	// all the addresses of one /24 (IPv4) or /64 (IPv6) count as one key.
	KeyPrefix *KeyPrefix `json:"key_prefix,omitempty"`

	// DryRun counts and reports everything as if enforced (refusals appear
	// in metrics with reason `dry_run`) but lets every connection through;
	// one that would be refused takes no slot.
	DryRun bool `json:"dry_run,omitempty"`

	// Replicas is the number of Caddy instances sharing the load: each
	// enforces ceil(max/replicas). With a store, only while it is
	// unreachable. Default: 1.
	Replicas int `json:"replicas,omitempty"`

	// Wait is how long a connection over a cap is held, unread, waiting
	// for a slot before it is closed (reason `timeout`). 0 closes it at
	// once.
	Wait caddy.Duration `json:"wait,omitempty"`

	// MaxWaiting bounds the connections waiting in this handler's zone;
	// one more is closed at once (reason `queue_full`). Default with
	// `wait`: 1000.
	MaxWaiting int `json:"max_waiting,omitempty"`

	// MaxWaitingPerKey bounds the connections waiting with one key (of the
	// Fair limit, or else the first). 0: no bound besides MaxWaiting.
	MaxWaitingPerKey int `json:"max_waiting_per_key,omitempty"`

	// Priority is a placeholder template giving a waiting connection its
	// class, `high`, `normal` or `low`, as in the HTTP handler.
	Priority string `json:"priority,omitempty"`

	// Fair names the limit whose keys share the slots fairly while
	// connections wait, as in the HTTP handler.
	Fair string `json:"fair,omitempty"`

	// Weight is a key's share under Fair: a number from 0.001 to 1000, or
	// a placeholder template resolving to one.
	Weight string `json:"weight,omitempty"`

	// MaxKeys bounds the keys each limit holds at once; a connection with
	// a new key is closed (reason `keys_full`) while it is reached.
	MaxKeys int `json:"max_keys,omitempty"`

	// PerKeyMetrics exports per-key series, keys hashed (raw with
	// PlainKeys), as in the HTTP handler.
	PerKeyMetrics bool `json:"per_key_metrics,omitempty"`

	// PlainKeys shows raw keys in per-key metrics and the admin API.
	PlainKeys bool `json:"plain_keys,omitempty"`

	// StoreRaw keeps the counts in a store shared by a fleet (`redis`): a
	// lease per connection, renewed while it is open. Module namespace:
	// `http.handlers.inflight.stores`.
	StoreRaw json.RawMessage `json:"store,omitempty" caddy:"namespace=http.handlers.inflight.stores inline_key=type"`

	gate     *inflight.Gate
	logger   *zap.Logger
	keys     []keyFunc
	priority keyFunc
	weight   keyFunc
	setIP    bool // a template other than a key of its own reads {l4.conn.remote_ip}

	warnNonTerminal sync.Once
}

// KeyPrefix is the prefix lengths `{l4.conn.remote_ip}` is cut to.
type KeyPrefix struct {
	// IPv4 is the prefix length of IPv4 addresses, 1-32. 0 (or 32): the
	// address.
	IPv4 int `json:"ipv4,omitempty"`
	// IPv6 is the prefix length of IPv6 addresses, 1-128. 0 (or 128): the
	// address.
	IPv6 int `json:"ipv6,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (*Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "layer4.handlers.inflight",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision joins the zone and compiles the key templates.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	if err := h.KeyPrefix.check(); err != nil {
		return err
	}
	cfg := &inflight.Handler{
		Limits: h.Limits, Total: h.Total, Zone: h.Zone, DryRun: h.DryRun, Replicas: h.Replicas,
		Wait: h.Wait, MaxWaiting: h.MaxWaiting, MaxWaitingPerKey: h.MaxWaitingPerKey,
		Priority: h.Priority, Fair: h.Fair, Weight: h.Weight, MaxKeys: h.MaxKeys,
		PerKeyMetrics: h.PerKeyMetrics, PlainKeys: h.PlainKeys, StoreRaw: h.StoreRaw,
	}
	for i := range cfg.Limits {
		if cfg.Limits[i].Key == "" {
			cfg.Limits[i].Key = RemoteIP
		}
	}
	var err error
	h.gate, err = inflight.JoinGate(ctx, cfg, siteOf(ctx), "connection")
	if err != nil {
		return err
	}
	h.compile(cfg)
	return nil
}

// Cleanup leaves the zone; connections still open release into it later.
func (h *Handler) Cleanup() error {
	if h.gate == nil {
		return nil
	}
	return h.gate.Leave()
}

// Handle admits the connection or closes it, and holds its slots until it
// is closed.
func (h *Handler) Handle(cx *layer4.Connection, next layer4.Handler) error {
	ip := h.remoteIP(cx)
	if h.setIP {
		cx.Replacer().Set(remoteIPKey, ip)
	}
	keys := make([]string, len(h.keys))
	for i, key := range h.keys {
		keys[i] = key(cx, ip)
	}
	var class, weight string
	if h.priority != nil {
		class = h.priority(cx, ip)
	}
	if h.weight != nil {
		weight = h.weight(cx, ip)
	}
	start := time.Now()
	t, limit, reason := h.gate.Admit(cx.Context, keys, class, weight)
	if t == nil {
		if reason == "dry_run" {
			return next.Handle(cx)
		}
		if ce := h.logger.Check(zap.DebugLevel, "closing connection"); ce != nil {
			ce.Write(zap.String("remote", cx.RemoteAddr().String()), zap.String("zone", h.gate.Zone()),
				zap.String("limit", limit), zap.String("reason", reason), zap.Duration("waited", time.Since(start)))
		}
		return nil // the server closes it
	}
	if isPacket(cx) {
		// A UDP session: caddy-l4 ends it when the handler chain returns,
		// and needs its own connection type in cx.Conn.
		defer t.Release()
		return next.Handle(cx)
	}
	cx.Conn = &releasingConn{Conn: cx.Conn, ticket: t}
	err := next.Handle(cx)
	switch {
	case err != nil && !hijacked(err):
		t.Release() // the server closes the connection
	case cx.Context.Value(listenerCtxKey) != nil:
		// A listener wrapper hands the connection to the HTTP server after
		// the routes, whichever handler returned: the HTTP server reads it
		// to its end or closes it. Should another route end it without
		// either, the slot goes back once the connection is unreachable.
		runtime.AddCleanup(cx, (*inflight.Ticket).Release, t)
	case !t.Released():
		// The handler that served the connection ends it by reading it to
		// its end or closing it, both seen here; this one did neither.
		h.warnNonTerminal.Do(func() {
			h.logger.Warn("inflight is in a route whose handlers returned while the connection was open: its slot is given back now; put inflight in the route of the handler that serves the connection, such as proxy",
				zap.String("zone", h.gate.Zone()))
		})
		t.Release()
	}
	return err
}

// listenerCtxKey is where caddy-l4's listener wrapper (caddy-l4 v0.1.2,
// layer4/connection.go listenerCtxKey, unexported) keeps itself in a
// connection's context. TestListenerWrapper fails if that changes.
var listenerCtxKey = caddy.CtxKey("listener")

// hijacked reports whether the layer4 listener wrapper handed the
// connection to the HTTP server, which returns this error (caddy-l4
// v0.1.2, layer4/listener.go errHijacked, unexported) from a subroute.
func hijacked(err error) bool {
	return err != nil && err.Error() == "hijacked connection"
}

// validate checks the prefix lengths.
func (p *KeyPrefix) check() error {
	switch {
	case p == nil:
		return nil
	case p.IPv4 < 0 || p.IPv4 > 32:
		return fmt.Errorf("inflight: key_prefix ipv4 %d is not allowed: want a prefix length 1-32", p.IPv4)
	case p.IPv6 < 0 || p.IPv6 > 128:
		return fmt.Errorf("inflight: key_prefix ipv6 %d is not allowed: want a prefix length 1-128", p.IPv6)
	}
	return nil
}

var errNoCloseWrite = errors.New("inflight: the connection cannot be half-closed")

// Interface guards
var (
	_ caddy.Provisioner  = (*Handler)(nil)
	_ caddy.CleanerUpper = (*Handler)(nil)
	_ layer4.NextHandler = (*Handler)(nil)
)
