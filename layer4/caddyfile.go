package layer4

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-inflight/caddy-inflight/caddyfile/options"
)

// UnmarshalCaddyfile reads the handler inside a layer4 route, with the
// options every protocol shares (see options.ParseBlock), and key_prefix:
//
//	inflight [<max>] {
//		limit       <name> <key> <max>   # repeatable; all must admit
//		total       <max>                # one cap across all keys
//		zone        <name>               # share counters with handlers naming it
//		key_prefix  <ipv4 bits> [<ipv6 bits>]  # {l4.conn.remote_ip} as a network
//		dry_run                          # count and report, never close
//		replicas    <n>                  # each of n instances enforces ceil(max/n)
//		wait        <duration>           # hold a connection for a slot (0)
//		max_waiting <n>                  # bound on waiting connections (1000)
//		max_waiting_per_key <n>          # bound on waiting connections of one key
//		priority    <placeholder>        # high | normal | low per connection
//		fair        <limit>              # share slots fairly among the limit's keys
//		weight      <placeholder>        # a key's share under fair
//		max_keys    <n>                  # bound on keys in flight per limit
//		metrics     per_key [plain]      # per-key series (hashed keys, or raw)
//		store       redis { ... }        # counts shared by a fleet, in Redis
//	}
//
// `inflight <max>` is short for `limit client {l4.conn.remote_ip} <max>`.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return options.ParseBlock(d, &h.Config, options.Block{
		DefaultKey:    RemoteIP,
		FixedMax:      true,
		Subdirectives: options.List("key_prefix"),
		Placeholder:   "{l4.vars.*}",
		CheckKey:      checkKey,
		Own: func(d *caddyfile.Dispenser, opt string) (bool, error) {
			if opt != "key_prefix" {
				return false, nil
			}
			return true, h.parseKeyPrefix(d)
		},
	})
}

// parseKeyPrefix reads `key_prefix <ipv4 bits> [<ipv6 bits>]`.
func (h *Handler) parseKeyPrefix(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) < 1 || len(args) > 2 {
		return d.Errf("inflight: key_prefix %q: want one or two arguments, key_prefix <ipv4 bits> [<ipv6 bits>], such as key_prefix 24 64", args)
	}
	p := new(KeyPrefix)
	for i, v := range args {
		n, err := prefixLength(i, v)
		if err != nil {
			return d.Errf("%v", err)
		}
		if i == 0 {
			p.IPv4 = n
		} else {
			p.IPv6 = n
		}
	}
	h.KeyPrefix = p
	return nil
}

var _ caddyfile.Unmarshaler = (*Handler)(nil)
