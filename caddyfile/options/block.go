// Package options reads, in a Caddyfile, the options every protocol's
// inflight directive shares (core.Config): the HTTP directive and the
// caddy-l4 handler both read their blocks with ParseBlock, and add their
// own options through Block.Own. It imports neither of them.
package options

import (
	"fmt"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
)

// Shared names the options ParseBlock reads, in the order of its
// reference.
var Shared = []string{"limit", "total", "zone", "dry_run", "replicas", "wait", "max_waiting", "max_waiting_per_key", "priority", "fair", "weight", "max_keys", "metrics", "store"}

// Block is how one protocol's inflight directive reads its block: the
// options every protocol shares (core.Config) are read here, the
// protocol's own by Own.
type Block struct {
	// Reader reads the options' arguments, and shows them in messages.
	Reader
	// DefaultKey is the key of `inflight <max>`: the client's address.
	DefaultKey string
	// FixedMax refuses a placeholder max (they are resolved per HTTP
	// request only).
	FixedMax bool
	// Subdirectives lists the block's options, for error messages (such
	// as List(own...)).
	Subdirectives string
	// Placeholder is an example placeholder of the protocol, for messages
	// (such as {tenant_priority}).
	Placeholder string
	// CheckKey, if set, refuses a limit's key the protocol cannot count by.
	CheckKey func(key string) error
	// OtherTotal, if set, tells that the protocol's own options cap the
	// total (an adaptive total): the block then needs no other limit.
	OtherTotal func() bool
	// Own reads one of the protocol's own options, whose name the
	// dispenser is on, and reports whether it knew it. It is asked first.
	Own func(d *caddyfile.Dispenser, opt string) (bool, error)
	// Done, if set, checks the protocol's options once the block is read
	// (the shared options' checks passed); written says where each option
	// stands.
	Done func(written Written) error
	// Warn, if set, receives the block's warnings instead of the log (see
	// logWarning): tests set it to see them.
	Warn func(caddyconfig.Warning)
}

// List lists the shared options, then a protocol's own, for
// Block.Subdirectives.
func List(own ...string) string {
	return strings.Join(append(Shared[:len(Shared):len(Shared)], own...), ", ")
}

// ParseBlock reads an inflight directive into cfg, the dispenser on the
// directive's name:
//
//	inflight [<max>] {
//		limit       <name> <key> <max>   # repeatable; all must admit
//		total       <max>                # one cap across all keys
//		zone        <name>               # share counters with handlers naming it
//		dry_run                          # count and report, never refuse
//		replicas    <n>                  # each of n instances enforces ceil(max/n)
//		wait        <duration>           # wait for a slot instead of refusing (0)
//		max_waiting <n>                  # bound on waiting units (1000)
//		max_waiting_per_key <n>          # bound on waiting units of one key
//		priority    <placeholder>        # high | normal | low per unit
//		fair        <limit>              # share slots fairly among the limit's keys
//		weight      <placeholder>        # a key's share under fair (class weight)
//		max_keys    <n>                  # bound on keys in flight per limit
//		metrics     per_key [plain]      # per-key series (hashed keys, or raw)
//		store       redis { ... }        # counts shared by a fleet, in Redis
//		...                              # the protocol's own (Block.Own)
//	}
//
// `inflight <max>` is short for `limit client <Block.DefaultKey> <max>`.
// Every error names the file and line.
func ParseBlock(d *caddyfile.Dispenser, cfg *core.Config, b Block) error {
	d.Next() // the directive's name
	args := d.RemainingArgs()
	shorthand := len(args) == 1
	switch len(args) {
	case 0:
	case 1:
		max, err := b.parseMax(args[0])
		if err != nil {
			return d.Errf("inflight: %v", err)
		}
		cfg.Limits = append(cfg.Limits, core.Limit{Name: "client", Key: b.DefaultKey, Max: max})
	default:
		return d.Errf("inflight: too many arguments %q: want at most one, the max per client IP", b.Shown(args))
	}
	written := Written{warn: b.warn()}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if written.Has(opt) && opt != "limit" {
			return d.Errf("inflight: %s is given twice: give it once", opt)
		}
		written.mark(d, opt)
		known := false
		if b.Own != nil {
			var err error
			if known, err = b.Own(d, opt); err != nil {
				return err
			}
		}
		if !known {
			if err := b.parseOption(d, cfg, opt, shorthand); err != nil {
				return err
			}
		}
		if probe := *d; probe.NextBlock(probe.Nesting()) {
			return d.Errf("inflight: %s takes no block { }: give its value on its line", opt)
		}
	}
	written.end = *d
	if len(cfg.Limits) == 0 && cfg.Total == 0 && (b.OtherTotal == nil || !b.OtherTotal()) {
		return d.Errf("inflight: no limit: give a max (inflight 20), a limit or a total")
	}
	if err := core.CheckFair(cfg.Fair, cfg.Limits); err != nil {
		return written.At("fair").Errf("inflight: %v", err)
	}
	if err := cfg.CheckWaitingPerKey(); err != nil {
		return written.At("max_waiting_per_key").Errf("inflight: %v", err)
	}
	if b.Done != nil {
		if err := b.Done(written); err != nil {
			return err
		}
	}
	for _, n := range cfg.Notices() {
		written.Warn(n.Setting, n.String())
	}
	return nil
}

// parseOption reads one shared option.
func (b Block) parseOption(d *caddyfile.Dispenser, cfg *core.Config, opt string, shorthand bool) error {
	var err error
	switch opt {
	case "limit":
		err = b.parseLimit(d, cfg, shorthand)
	case "total":
		cfg.Total, err = b.capInt(d, opt)
	case "zone":
		cfg.Zone, err = b.checked(d, opt, "a zone name", core.CheckZone)
	case "dry_run":
		if d.NextArg() {
			return d.Errf("inflight: dry_run takes no arguments, got %q", d.Val())
		}
		cfg.DryRun = true
	case "replicas":
		cfg.Replicas, err = b.PositiveInt(d, opt)
	case "wait":
		var dur time.Duration
		dur, err = b.Duration(d, opt, true)
		cfg.Wait = caddy.Duration(dur)
	case "max_waiting":
		cfg.MaxWaiting, err = b.PositiveInt(d, opt)
	case "max_waiting_per_key":
		cfg.MaxWaitingPerKey, err = b.PositiveInt(d, opt)
	case "priority":
		cfg.Priority, err = b.checked(d, opt, "high, normal or low, or a placeholder such as "+b.placeholder("priority"), core.CheckPriority)
	case "fair":
		cfg.Fair, err = b.OneArg(d, opt, "the name of a limit, such as fair tenant")
	case "weight":
		cfg.Weight, err = b.checked(d, opt, "a placeholder such as "+b.placeholder("weight")+", or a number", core.CheckWeight)
	case "max_keys":
		cfg.MaxKeys, err = b.PositiveInt(d, opt)
	case "metrics":
		err = parseMetrics(d, cfg)
	case "store":
		err = parseStore(d, cfg, b.warn())
	default:
		return d.Errf("inflight: unknown subdirective %q: want one of %s", opt, b.Subdirectives)
	}
	return err
}

// warn returns where the block's warnings go.
func (b Block) warn() func(caddyconfig.Warning) {
	if b.Warn != nil {
		return b.Warn
	}
	return logWarning
}

// placeholder is an example placeholder named after what it gives.
func (b Block) placeholder(what string) string {
	return strings.Replace(b.Placeholder, "*", what, 1)
}

// parseMax reads a limit's max.
func (b Block) parseMax(v string) (core.Max, error) {
	max, err := core.ParseMax(v)
	if b.FixedMax && (err != nil || max.Placeholder != "") {
		return core.Max{}, fmt.Errorf("max %q is not allowed: want %s", v, core.CapRange)
	}
	return max, err
}

// parseLimit reads `limit <name> <key> <max>`; shorthand tells that the
// first limit came from `inflight <max>`.
func (b Block) parseLimit(d *caddyfile.Dispenser, cfg *core.Config, shorthand bool) error {
	args := d.RemainingArgs()
	if len(args) != 3 {
		return d.Errf("inflight: limit %q: want three arguments, limit <name> <key> <max>", b.Shown(args))
	}
	if err := core.CheckLimitName(args[0]); err != nil {
		return d.Errf("inflight: limit %s", err)
	}
	if b.CheckKey != nil {
		if err := b.CheckKey(args[1]); err != nil {
			return d.Errf("inflight: limit %s: %v", args[0], err)
		}
	}
	max, err := b.parseMax(args[2])
	if err != nil {
		return d.Errf("inflight: limit %s: %v", args[0], err)
	}
	for i, l := range cfg.Limits {
		switch {
		case l.Name != args[0]:
		case i == 0 && shorthand:
			return d.Errf("inflight: limit %q is already defined by the max after inflight (inflight <max> means limit client %s <max>): give this limit another name", args[0], b.show(b.DefaultKey))
		default:
			return d.Errf("inflight: limit %q is given twice: each limit needs its own name", args[0])
		}
	}
	cfg.Limits = append(cfg.Limits, core.Limit{Name: args[0], Key: args[1], Max: max})
	return nil
}

// parseMetrics reads `metrics per_key [plain]`.
func parseMetrics(d *caddyfile.Dispenser, cfg *core.Config) error {
	args := d.RemainingArgs()
	if len(args) == 0 || len(args) > 2 || args[0] != "per_key" || (len(args) == 2 && args[1] != "plain") {
		return d.Errf("inflight: metrics %q is not allowed: want metrics per_key, or metrics per_key plain", args)
	}
	cfg.PerKeyMetrics = true
	cfg.PlainKeys = len(args) == 2
	return nil
}

// parseStore reads `store <type> { ... }` with the store module's own
// Caddyfile syntax, and hands its warnings to warn.
func parseStore(d *caddyfile.Dispenser, cfg *core.Config, warn func(caddyconfig.Warning)) error {
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
	if w, ok := unm.(warner); ok {
		for _, warning := range w.CaddyfileWarnings() {
			warn(warning)
		}
	}
	cfg.StoreRaw = caddyconfig.JSONModuleObject(unm, "type", name, nil)
	return nil
}

// warner is a store that has warnings from reading its Caddyfile block,
// each with its file and line: a store's unmarshaler is handed only a
// dispenser, so it keeps them for the directive to report.
type warner interface {
	CaddyfileWarnings() []caddyconfig.Warning
}
