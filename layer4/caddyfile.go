package layer4

import (
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-inflight/caddy-inflight/inflight"
)

// subdirectives lists the block's options, for error messages.
const subdirectives = "limit, total, zone, key_prefix, dry_run, replicas, wait, max_waiting, max_waiting_per_key, priority, fair, weight, max_keys, metrics, store"

// UnmarshalCaddyfile reads the handler inside a layer4 route:
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
	d.Next() // the handler's name
	args := d.RemainingArgs()
	switch len(args) {
	case 0:
	case 1:
		max, err := inflight.ParseMax(args[0])
		if err != nil || max.Placeholder != "" {
			return d.Errf("inflight: max %q is not allowed: want a positive integer", args[0])
		}
		h.Limits = append(h.Limits, inflight.Limit{Name: "client", Key: RemoteIP, Max: max})
	default:
		return d.Errf("inflight: too many arguments %q: want at most one, the max per client IP", args)
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] && opt != "limit" {
			return d.Errf("inflight: %s is given twice: give it once", opt)
		}
		seen[opt] = true
		var err error
		switch opt {
		case "limit":
			err = h.parseLimit(d, len(args) == 1)
		case "total":
			h.Total, err = positiveInt(d, opt)
		case "zone":
			h.Zone, err = oneArg(d, opt, "a zone name")
			if err == nil && strings.Contains(h.Zone, "#") {
				err = d.Errf("inflight: zone %q is not allowed: '#' marks the automatic names of unnamed zones; choose a name without it", h.Zone)
			}
		case "key_prefix":
			err = h.parseKeyPrefix(d)
		case "dry_run":
			if d.NextArg() {
				return d.Errf("inflight: dry_run takes no arguments, got %q", d.Val())
			}
			h.DryRun = true
		case "replicas":
			h.Replicas, err = positiveInt(d, opt)
		case "wait":
			var v string
			if v, err = oneArg(d, opt, "a duration such as 30s"); err == nil {
				dur, perr := caddy.ParseDuration(v)
				if perr != nil || dur < 0 {
					return d.Errf("inflight: wait %q is not allowed: want a duration such as 30s, or 0", v)
				}
				h.Wait = caddy.Duration(dur)
			}
		case "max_waiting":
			h.MaxWaiting, err = positiveInt(d, opt)
		case "max_waiting_per_key":
			h.MaxWaitingPerKey, err = positiveInt(d, opt)
		case "priority":
			h.Priority, err = oneArg(d, opt, "a placeholder such as {l4.vars.priority}")
		case "fair":
			h.Fair, err = oneArg(d, opt, "the name of a limit, such as fair client")
		case "weight":
			h.Weight, err = oneArg(d, opt, "a placeholder, or a number")
		case "max_keys":
			h.MaxKeys, err = positiveInt(d, opt)
		case "metrics":
			rest := d.RemainingArgs()
			if len(rest) == 0 || len(rest) > 2 || rest[0] != "per_key" || (len(rest) == 2 && rest[1] != "plain") {
				return d.Errf("inflight: metrics %q is not allowed: want metrics per_key, or metrics per_key plain", rest)
			}
			h.PerKeyMetrics, h.PlainKeys = true, len(rest) == 2
		case "store":
			err = h.parseStore(d)
		default:
			return d.Errf("inflight: unknown subdirective %q: want one of %s", opt, subdirectives)
		}
		if err != nil {
			return err
		}
	}
	if len(h.Limits) == 0 && h.Total == 0 {
		return d.Errf("inflight: no limit: give a max (inflight 20), a limit or a total")
	}
	if h.Fair != "" && !slices.ContainsFunc(h.Limits, func(l inflight.Limit) bool { return l.Name == h.Fair }) {
		return d.Errf("inflight: fair %q is not allowed: want the name of one of this block's limits", h.Fair)
	}
	return nil
}

// parseLimit reads `limit <name> <key> <max>`.
func (h *Handler) parseLimit(d *caddyfile.Dispenser, shorthand bool) error {
	args := d.RemainingArgs()
	if len(args) != 3 {
		return d.Errf("inflight: limit %q: want three arguments, limit <name> <key> <max>", args)
	}
	if err := inflight.CheckLimitName(args[0]); err != nil {
		return d.Errf("inflight: limit %s", err)
	}
	max, err := inflight.ParseMax(args[2])
	if err != nil || max.Placeholder != "" {
		return d.Errf("inflight: limit %s: max %q is not allowed: want a positive integer", args[0], args[2])
	}
	for i, l := range h.Limits {
		switch {
		case l.Name != args[0]:
		case i == 0 && shorthand:
			return d.Errf("inflight: limit %q is already defined by the max after inflight (inflight <max> means limit client {l4.conn.remote_ip} <max>): give this limit another name", args[0])
		default:
			return d.Errf("inflight: limit %q is given twice: each limit needs its own name", args[0])
		}
	}
	h.Limits = append(h.Limits, inflight.Limit{Name: args[0], Key: args[1], Max: max})
	return nil
}

// parseKeyPrefix reads `key_prefix <ipv4 bits> [<ipv6 bits>]`.
func (h *Handler) parseKeyPrefix(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) < 1 || len(args) > 2 {
		return d.Errf("inflight: key_prefix %q: want one or two arguments, key_prefix <ipv4 bits> [<ipv6 bits>], such as key_prefix 24 64", args)
	}
	p := new(KeyPrefix)
	for i, v := range args {
		family, most := "ipv4", 32
		if i == 1 {
			family, most = "ipv6", 128
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > most {
			return d.Errf("inflight: key_prefix %s %q is not allowed: want a prefix length 1-%d", family, v, most)
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

// parseStore reads `store <type> { ... }` with the store module's own
// Caddyfile syntax.
func (h *Handler) parseStore(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.Errf("inflight: store: want a store type, such as store redis { address 127.0.0.1:6379 }")
	}
	name := d.Val()
	id := "http.handlers.inflight.stores." + name
	if _, err := caddy.GetModule(id); err != nil {
		return d.Errf("inflight: store %q is not allowed: want redis", name)
	}
	unm, err := caddyfile.UnmarshalModule(d, id)
	if err != nil {
		return err
	}
	h.StoreRaw = caddyconfig.JSONModuleObject(unm, "type", name, nil)
	return nil
}

func oneArg(d *caddyfile.Dispenser, opt, want string) (string, error) {
	args := d.RemainingArgs()
	if len(args) != 1 {
		return "", d.Errf("inflight: %s %q: want one argument, %s", opt, args, want)
	}
	return args[0], nil
}

func positiveInt(d *caddyfile.Dispenser, opt string) (int, error) {
	v, err := oneArg(d, opt, "a positive integer")
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, d.Errf("inflight: %s %q is not allowed: want a positive integer", opt, v)
	}
	return n, nil
}

var _ caddyfile.Unmarshaler = (*Handler)(nil)
