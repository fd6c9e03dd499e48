// Package layer4 is the caddy-l4 connection handler `inflight`
// (layer4.handlers.inflight): it caps the connections one client, or any
// key of a connection, may have open at once: an edge of inflight/core,
// with the options, zones, admission, metrics and admin API of the HTTP
// handler `inflight`. It is a module of
// its own, so that builds without caddy-l4 never compile it:
//
//	xcaddy build --with github.com/mholt/caddy-l4 --with github.com/caddy-inflight/caddy-inflight/layer4
package layer4

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/mholt/caddy-l4/layer4"
	"go.uber.org/zap"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
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
	// Limits, Total, Zone, DryRun, Replicas, Wait, MaxWaiting,
	// MaxWaitingPerKey, Priority, Fair, Weight, MaxKeys, PerKeyMetrics,
	// PlainKeys and Store, as in the HTTP handler (see core.Config), for
	// connections. Keys, and the priority and weight templates, are
	// placeholder templates of the layer4 app, and `{l4.conn.remote_ip}`:
	// the client's IP address, without the port (after a proxy_protocol
	// handler, the address it carried), as a prefix with KeyPrefix; the
	// default key. `{l4.conn.remote_addr}` (address and port) is refused
	// as a key: every connection would be a key of its own. Maxes are
	// fixed positive integers. With a store, each connection holds a
	// lease, renewed while it is open.
	core.Config

	// KeyPrefix makes `{l4.conn.remote_ip}` the client's network, so that
	// all the addresses of one /24 (IPv4) or /64 (IPv6) count as one key.
	KeyPrefix *KeyPrefix `json:"key_prefix,omitempty"`

	gate     *core.Gate
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
	for i, l := range h.Limits {
		if l.Key == "" {
			h.Limits[i].Key = RemoteIP
		}
		if err := checkKey(l.Key); err != nil {
			return fmt.Errorf("inflight: limit %q: %v", l.Name, err)
		}
	}
	var err error
	h.gate, err = core.Join(ctx, &h.Config, core.Edge{Site: siteOf(ctx), Noun: "connection", AddressKeys: []string{RemoteIP}})
	if err != nil {
		return err
	}
	h.compile()
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
	s := &slot{gate: h.gate}
	h.gate.InitTicket(&s.ticket)
	for i, key := range h.keys {
		s.ticket.Req.Keys[i] = key(cx, ip)
	}
	var class, weight string
	if h.priority != nil {
		class = h.priority(cx, ip)
	}
	if h.weight != nil {
		weight = h.weight(cx, ip)
	}
	v := h.gate.Admit(cx.Context, &s.ticket, class, weight)
	switch {
	case v.Outcome == limiter.Admitted:
	case v.Reason == core.ReasonDryRun:
		return next.Handle(cx)
	default:
		if ce := h.logger.Check(zap.DebugLevel, "closing connection"); ce != nil {
			reason := v.Reason
			if v.Outcome == limiter.Aborted {
				reason = "aborted"
			}
			ce.Write(zap.String("remote", cx.RemoteAddr().String()), zap.String("zone", h.gate.Zone()),
				zap.String("limit", v.Limit), zap.String("reason", reason), zap.Duration("waited", v.Waited))
		}
		return nil // the server closes it
	}
	if isPacket(cx) {
		// A UDP session: caddy-l4 ends it when the handler chain returns,
		// and needs its own connection type in cx.Conn.
		defer s.release()
		return next.Handle(cx)
	}
	conn := &releasingConn{Conn: cx.Conn, slot: s}
	cx.Conn = conn
	err := next.Handle(cx)
	switch {
	case err != nil && !hijacked(err):
		s.release() // the server closes the connection
	case cx.Context.Value(listenerCtxKey) != nil:
		// A listener wrapper hands the connection to the HTTP server after
		// the routes, whichever handler returned: the HTTP server reads it
		// to its end or closes it. Should another route end it without
		// either, the slot goes back once the connection is unreachable.
		runtime.AddCleanup(cx, (*slot).release, s)
	case !conn.ended():
		// The handler that served the connection ends it by reading it to
		// its end or closing it, both seen here; this one did neither.
		h.warnNonTerminal.Do(func() {
			h.logger.Warn("inflight is in a route whose handlers returned while the connection was open: its slot is given back now; put inflight in the route of the handler that serves the connection, such as proxy",
				zap.String("zone", h.gate.Zone()))
		})
		s.release()
	default:
		s.release() // the server closes the connection
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

// check refuses a prefix length out of its family's range; 0 is unset.
func (p *KeyPrefix) check() error {
	if p == nil {
		return nil
	}
	for i, n := range [...]int{p.IPv4, p.IPv6} {
		if n != 0 {
			if _, err := prefixLength(i, strconv.Itoa(n)); err != nil {
				return err
			}
		}
	}
	return nil
}

// prefixLength reads v, the IPv4 (i 0) or IPv6 (i 1) prefix length of
// key_prefix.
func prefixLength(i int, v string) (int, error) {
	family, bits := "ipv4", 32
	if i == 1 {
		family, bits = "ipv6", 128
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > bits {
		return 0, fmt.Errorf("inflight: key_prefix %s %q is not allowed: want a prefix length 1-%d", family, v, bits)
	}
	return n, nil
}

var errNoCloseWrite = errors.New("inflight: the connection cannot be half-closed")

// Interface guards
var (
	_ caddy.Provisioner  = (*Handler)(nil)
	_ caddy.CleanerUpper = (*Handler)(nil)
	_ layer4.NextHandler = (*Handler)(nil)
)
