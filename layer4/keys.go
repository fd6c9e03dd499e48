package layer4

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/mholt/caddy-l4/layer4"
)

// RemoteIP is the placeholder of the client's IP address, without the
// port, the default key: `inflight 20` counts connections per client
// address. caddy-l4 has `{l4.conn.remote_addr}` (address and port, as
// accepted); this handler adds the address alone, read when the
// connection reaches it (so after a proxy_protocol handler, the address it
// carried), cut to KeyPrefix.
const RemoteIP = "{" + remoteIPKey + "}"

const remoteIPKey = "l4.conn.remote_ip"

// keyFunc evaluates a template for one connection; ip is its RemoteIP.
type keyFunc func(cx *layer4.Connection, ip string) string

// remoteAddr is caddy-l4's placeholder of the client's address and port.
const remoteAddr = "{l4.conn.remote_addr}"

// checkKey refuses a limit key that counts nothing: with the client's port,
// every connection is a key of its own.
func checkKey(key string) error {
	if strings.Contains(key, remoteAddr) {
		return fmt.Errorf("key %q is not allowed: %s includes the client's port, so every connection would be a key of its own; want %s, the client's address", key, remoteAddr, RemoteIP)
	}
	return nil
}

// compile turns the templates into functions: a constant, the remote IP,
// or the replacer's evaluation.
func (h *Handler) compile() {
	h.keys = make([]keyFunc, len(h.Limits))
	for i, l := range h.Limits {
		h.keys[i] = h.template(l.Key)
	}
	if h.Priority != "" {
		h.priority = h.template(h.Priority)
	}
	if h.Weight != "" && h.Fair != "" {
		h.weight = h.template(h.Weight)
	}
}

func (h *Handler) template(tmpl string) keyFunc {
	switch {
	case tmpl == RemoteIP:
		return func(_ *layer4.Connection, ip string) string { return ip }
	case !strings.Contains(tmpl, "{"):
		return func(*layer4.Connection, string) string { return tmpl }
	}
	if strings.Contains(tmpl, RemoteIP) {
		h.setIP = true
	}
	return func(cx *layer4.Connection, _ string) string { return cx.Replacer().ReplaceAll(tmpl, "") }
}

// remoteIP returns the client's address (an IPv4-mapped IPv6 address as
// IPv4), or its network with a KeyPrefix, such as 192.0.2.0/24; "" if the
// connection has no IP address (a unix socket), which no limit keyed by it
// then counts.
func (h *Handler) remoteIP(cx *layer4.Connection) string {
	var addr netip.Addr
	switch a := cx.RemoteAddr().(type) {
	case *net.TCPAddr:
		addr, _ = netip.AddrFromSlice(a.IP)
	case *net.UDPAddr:
		addr, _ = netip.AddrFromSlice(a.IP)
	default:
		ap, err := netip.ParseAddrPort(a.String())
		if err != nil {
			return ""
		}
		addr = ap.Addr()
	}
	if !addr.IsValid() {
		return ""
	}
	addr = addr.Unmap()
	bits := 0
	if p := h.KeyPrefix; p != nil {
		bits = p.IPv6
		if addr.Is4() {
			bits = p.IPv4
		}
	}
	if bits == 0 || bits == addr.BitLen() {
		return addr.WithZone("").String()
	}
	prefix, _ := addr.WithZone("").Prefix(bits)
	return prefix.String()
}

// isPacket reports whether cx is a UDP session of the layer4 app.
func isPacket(cx *layer4.Connection) bool {
	_, ok := cx.RemoteAddr().(*net.UDPAddr)
	return ok
}
