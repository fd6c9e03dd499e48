// Package caddyfile registers the `inflight` and `inflight_ui` Caddyfile
// directives and their default places in the directive order.
package caddyfile

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/caddy-inflight/caddy-inflight/inflight"
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("inflight", parse)
	// After authentication, so keys may use the authenticated identity, and
	// before encode, handle, route and the handlers that do the work.
	httpcaddyfile.RegisterDirectiveOrder("inflight", httpcaddyfile.After, "forward_auth")
	// The live page: after authentication, and before inflight (inserted
	// right after forward_auth, ahead of it), so that watching a saturated
	// zone never takes or waits for one of its slots.
	httpcaddyfile.RegisterHandlerDirective("inflight_ui", parseUI)
	httpcaddyfile.RegisterDirectiveOrder("inflight_ui", httpcaddyfile.After, "forward_auth")
}

// subdirectives lists the block's options, for error messages.
const subdirectives = "limit, total, cost, zone, status, retry_after, dry_run, replicas, wait, max_waiting, priority, max_keys, metrics, store, fair, weight, max_waiting_per_key, wait_body_buffer, limit_headers"

// parse reads the inflight directive into the handler's JSON:
//
//	inflight [<matcher>] [<max>] {
//		limit       <name> <key> <max>   # repeatable; all must admit
//		total       <max>                # one cap across all keys
//		total       adaptive [{          # one cap that finds the backend's capacity
//			min       <n>                #   never below (1)
//			max       <n>                #   never above (1000)
//			initial   <n>                #   where it starts (4)
//			tolerance <fraction>         #   slowdown before it shrinks (0.2)
//			window    <duration>         #   shortest time between changes (250ms)
//			overload_status <codes...>   #   statuses that mean overload (429 502 503 504)
//		}]
//		cost        <n>|<placeholder>    # units a request takes from every cap (1)
//		cost        tokens [{            # units: an LLM request's tokens, estimated
//			bytes_per_token <n>          #   body bytes per token (4)
//			default_output  <n>          #   output tokens when the body names none (1024)
//			max_body        <size>       #   body read at most (1MiB)
//		}]
//		zone        <name>               # share counters with handlers naming it
//		status      <code>               # refusal status, 400-599 (429)
//		retry_after <duration>           # Retry-After of refusals (1s)
//		dry_run                          # count and report, never refuse
//		replicas    <n>                  # each of n instances enforces ceil(max/n)
//		wait        <duration>           # wait for a slot instead of refusing (0)
//		max_waiting <n>                  # bound on waiting requests (1000)
//		max_waiting_per_key <n>          # bound on waiting requests of one key
//		wait_body_buffer <size>          # body read ahead per waiting request (64KiB)
//		priority    <placeholder>        # high | normal | low per request
//		fair        <limit>              # share slots fairly among the limit's keys
//		weight      <placeholder>        # a key's share under fair (class weight)
//		max_keys    <n>                  # bound on keys in flight per limit
//		metrics     per_key [plain]      # per-key series (hashed keys, or raw)
//		limit_headers <limit...>         # RateLimit fields: each limit's level for the client
//		store       redis { ... }        # counts shared by a fleet, in Redis
//	}
//
// `inflight <max>` is short for `limit client {client_ip} <max>`. A max may be
// a placeholder that resolves to a positive integer per request.
func parse(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	hd := new(inflight.Handler)
	h.Next() // the directive's name
	args := h.RemainingArgs()
	shorthand := len(args) == 1
	switch len(args) {
	case 0:
	case 1:
		max, err := inflight.ParseMax(args[0])
		if err != nil {
			return nil, h.Errf("inflight: %v", err)
		}
		hd.Limits = append(hd.Limits, inflight.Limit{Name: "client", Key: inflight.DefaultKey, Max: max})
	default:
		return nil, h.Errf("inflight: too many arguments %q: want at most one, the max per client IP", shortForms(args))
	}

	seen := map[string]bool{}
	for h.NextBlock(0) {
		opt := h.Val()
		if seen[opt] && opt != "limit" {
			return nil, h.Errf("inflight: %s is given twice: give it once", opt)
		}
		seen[opt] = true
		var err error
		switch opt {
		case "limit":
			err = parseLimit(h, hd, shorthand)
		case "total":
			err = parseTotal(h, hd)
		case "cost":
			err = parseCost(h, hd)
		case "zone":
			hd.Zone, err = zoneName(h)
		case "status":
			hd.StatusCode, err = statusCode(h)
		case "retry_after":
			var d time.Duration
			d, err = duration(h, opt, false)
			hd.RetryAfter = caddy.Duration(d)
		case "dry_run":
			if h.NextArg() {
				return nil, h.Errf("inflight: dry_run takes no arguments, got %q", h.Val())
			}
			hd.DryRun = true
		case "replicas":
			hd.Replicas, err = positiveInt(h, opt)
		case "wait":
			var d time.Duration
			d, err = duration(h, opt, true)
			hd.Wait = caddy.Duration(d)
		case "max_waiting":
			hd.MaxWaiting, err = positiveInt(h, opt)
		case "max_waiting_per_key":
			hd.MaxWaitingPerKey, err = positiveInt(h, opt)
		case "wait_body_buffer":
			hd.WaitBodyBuffer, err = byteSize(h, opt)
		case "priority":
			hd.Priority, err = checked(h, opt, "high, normal or low, or a placeholder such as {tenant_priority}", inflight.CheckPriority)
		case "fair":
			hd.Fair, err = oneArg(h, opt, "the name of a limit, such as fair tenant")
		case "weight":
			hd.Weight, err = checked(h, opt, "a placeholder such as {tenant_weight}, or a number", inflight.CheckWeight)
		case "max_keys":
			hd.MaxKeys, err = positiveInt(h, opt)
		case "metrics":
			err = parseMetrics(h, hd)
		case "store":
			if hd.TotalAdaptive != nil {
				return nil, h.Errf("inflight: %v", inflight.ErrAdaptiveWithStore)
			}
			err = parseStore(h, hd)
		case "limit_headers":
			err = parseLimitHeaders(h, hd)
		default:
			return nil, h.Errf("inflight: unknown subdirective %q: want one of %s", opt, subdirectives)
		}
		if err != nil {
			return nil, err
		}
	}
	if len(hd.Limits) == 0 && hd.Total == 0 && hd.TotalAdaptive == nil {
		return nil, h.Errf("inflight: no limit: give a max (inflight 20), a limit or a total")
	}
	if hd.Fair != "" && !slices.ContainsFunc(hd.Limits, func(l inflight.Limit) bool { return l.Name == hd.Fair }) {
		return nil, h.Errf("inflight: fair %q is not allowed: want the name of one of this block's limits", hd.Fair)
	}
	if err := checkLimitHeaders(h, hd); err != nil {
		return nil, err
	}
	return hd, nil
}

// parseLimitHeaders reads `limit_headers <limit>...`.
func parseLimitHeaders(h httpcaddyfile.Helper, hd *inflight.Handler) error {
	hd.LimitHeaders = h.RemainingArgs()
	if len(hd.LimitHeaders) == 0 {
		return h.Err("inflight: limit_headers: want the names of one or more of this block's limits, or total")
	}
	for i, name := range hd.LimitHeaders {
		if slices.Contains(hd.LimitHeaders[:i], name) {
			return h.Errf("inflight: limit_headers %q is given twice: name each limit once", name)
		}
	}
	return nil
}

// checkLimitHeaders refuses a name in limit_headers that is neither a limit
// of the block nor its total.
func checkLimitHeaders(h httpcaddyfile.Helper, hd *inflight.Handler) error {
	allowed := make([]string, 0, len(hd.Limits)+1)
	for _, l := range hd.Limits {
		allowed = append(allowed, l.Name)
	}
	if hd.Total > 0 || hd.TotalAdaptive != nil {
		allowed = append(allowed, "total")
	}
	for _, name := range hd.LimitHeaders {
		if !slices.Contains(allowed, name) {
			return h.Errf("inflight: limit_headers %q is not allowed: want the names of this block's limits %q", name, allowed)
		}
	}
	return nil
}

// parseLimit reads `limit <name> <key> <max>`; shorthand tells that the
// first limit came from `inflight <max>`.
func parseLimit(h httpcaddyfile.Helper, hd *inflight.Handler, shorthand bool) error {
	args := h.RemainingArgs()
	if len(args) != 3 {
		return h.Errf("inflight: limit %q: want three arguments, limit <name> <key> <max>", shortForms(args))
	}
	if err := inflight.CheckLimitName(args[0]); err != nil {
		return h.Errf("inflight: limit %s", err)
	}
	max, err := inflight.ParseMax(args[2])
	if err != nil {
		return h.Errf("inflight: limit %s: %v", args[0], err)
	}
	for i, l := range hd.Limits {
		switch {
		case l.Name != args[0]:
		case i == 0 && shorthand:
			return h.Errf("inflight: limit %q is already defined by the max after inflight (inflight <max> means limit client {client_ip} <max>): give this limit another name", args[0])
		default:
			return h.Errf("inflight: limit %q is given twice: each limit needs its own name", args[0])
		}
	}
	hd.Limits = append(hd.Limits, inflight.Limit{Name: args[0], Key: args[1], Max: max})
	return nil
}

// parseTotal reads `total <max>` or `total adaptive [{ ... }]`.
func parseTotal(h httpcaddyfile.Helper, hd *inflight.Handler) error {
	args := h.RemainingArgs()
	if len(args) != 1 {
		return h.Errf("inflight: total %q: want one argument, a positive integer or adaptive", args)
	}
	if args[0] != "adaptive" {
		n, err := strconv.Atoi(args[0])
		if err != nil || n <= 0 || n > limiter.MaxCost {
			return h.Errf("inflight: total %q is not allowed: want %s, or adaptive", args[0], inflight.CapRange)
		}
		hd.Total = n
		return nil
	}
	if hd.StoreRaw != nil {
		return h.Errf("inflight: %v", inflight.ErrAdaptiveWithStore)
	}
	at := new(inflight.AdaptiveTotal)
	hd.TotalAdaptive = at
	for h.NextBlock(1) {
		opt := h.Val()
		var err error
		switch opt {
		case "min":
			at.Min, err = positiveInt(h, "total adaptive: "+opt)
		case "max":
			at.Max, err = positiveInt(h, "total adaptive: "+opt)
		case "initial":
			at.Initial, err = positiveInt(h, "total adaptive: "+opt)
		case "tolerance":
			at.Tolerance, err = tolerance(h)
		case "window":
			var d time.Duration
			d, err = duration(h, "total adaptive: window", false)
			at.Window = caddy.Duration(d)
		case "overload_status":
			at.OverloadStatus, err = overloadStatus(h)
		default:
			return h.Errf("inflight: total adaptive: unknown option %q: want one of min, max, initial, tolerance, window, overload_status", opt)
		}
		if err != nil {
			return err
		}
	}
	if err := at.Check(); err != nil {
		return h.Errf("inflight: %v", err)
	}
	return nil
}

// tolerance reads a fraction such as 0.2, above 0 and at most 10.
func tolerance(h httpcaddyfile.Helper) (float64, error) {
	v, err := oneArg(h, "total adaptive: tolerance", "a fraction such as 0.2")
	if err != nil {
		return 0, err
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0 && f <= 10) {
		return 0, h.Errf("inflight: total adaptive: tolerance %q is not allowed: want a fraction such as 0.2 (20 %%), above 0 and at most 10", v)
	}
	return f, nil
}

// overloadStatus reads one or more status codes 400-599.
func overloadStatus(h httpcaddyfile.Helper) ([]int, error) {
	args := h.RemainingArgs()
	if len(args) == 0 {
		return nil, h.Err("inflight: total adaptive: overload_status: want one or more status codes 400-599, such as 429 502 503 504")
	}
	codes := make([]int, len(args))
	for i, v := range args {
		n, err := strconv.Atoi(v)
		if err != nil || n < 400 || n > 599 {
			return nil, h.Errf("inflight: total adaptive: overload_status %q is not allowed: want status codes 400-599, such as 429 502 503 504", v)
		}
		codes[i] = n
	}
	return codes, nil
}

// parseMetrics reads `metrics per_key [plain]`.
func parseMetrics(h httpcaddyfile.Helper, hd *inflight.Handler) error {
	args := h.RemainingArgs()
	if len(args) == 0 || len(args) > 2 || args[0] != "per_key" || (len(args) == 2 && args[1] != "plain") {
		return h.Errf("inflight: metrics %q is not allowed: want metrics per_key, or metrics per_key plain", args)
	}
	hd.PerKeyMetrics = true
	hd.PlainKeys = len(args) == 2
	return nil
}

// parseStore reads `store <type> { ... }` with the store module's own
// Caddyfile syntax.
func parseStore(h httpcaddyfile.Helper, hd *inflight.Handler) error {
	if !h.NextArg() {
		return h.Errf("inflight: store: want a store type, such as store redis { address 127.0.0.1:6379 }")
	}
	name := h.Val()
	id := "http.handlers.inflight.stores." + name
	if _, err := caddy.GetModule(id); err != nil {
		return h.Errf("inflight: store %q is not allowed: want redis", name)
	}
	unm, err := caddyfile.UnmarshalModule(h.Dispenser, id)
	if err != nil {
		return err
	}
	hd.StoreRaw = caddyconfig.JSONModuleObject(unm, "type", name, nil)
	return nil
}

// checked reads one argument and refuses it, at its line, if check does.
func checked(h httpcaddyfile.Helper, opt, want string, check func(string) error) (string, error) {
	v, err := oneArg(h, opt, want)
	if err == nil {
		if err = check(v); err != nil {
			err = h.Errf("inflight: %v", err)
		}
	}
	return v, err
}

func oneArg(h httpcaddyfile.Helper, opt, want string) (string, error) {
	args := h.RemainingArgs()
	if len(args) != 1 {
		return "", h.Errf("inflight: %s %q: want one argument, %s", opt, shortForms(args), want)
	}
	return args[0], nil
}

// zoneName reads a zone's name, which may not contain '#', the mark of the
// automatic names of unnamed zones.
func zoneName(h httpcaddyfile.Helper) (string, error) {
	v, err := oneArg(h, "zone", "a zone name")
	if err == nil && strings.Contains(v, "#") {
		err = h.Errf("inflight: zone %q is not allowed: '#' marks the automatic names of unnamed zones; choose a name without it", v)
	}
	return v, err
}

func positiveInt(h httpcaddyfile.Helper, opt string) (int, error) {
	v, err := oneArg(h, opt, "a positive integer")
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, h.Errf("inflight: %s %q is not allowed: want a positive integer", opt, v)
	}
	return n, nil
}

// byteSize reads a positive size in bytes, such as 65536, 64KiB or 1MB.
func byteSize(h httpcaddyfile.Helper, opt string) (int, error) {
	v, err := oneArg(h, opt, "a size such as 64KiB")
	if err != nil {
		return 0, err
	}
	n, err := humanize.ParseBytes(v)
	if err != nil || n == 0 || n > math.MaxInt32 {
		return 0, h.Errf("inflight: %s %q is not allowed: want a size such as 64KiB or 1MB, at least 1 byte and below 2GiB", opt, v)
	}
	return int(n), nil
}

func statusCode(h httpcaddyfile.Helper) (int, error) {
	v, err := oneArg(h, "status", "a status code 400-599")
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 400 || n > 599 {
		return 0, h.Errf("inflight: status %q is not allowed: want a status code 400-599", v)
	}
	return n, nil
}

// duration reads a Caddy duration (such as 1s, 1m30s or 1d); zero is
// allowed only where it means "off".
func duration(h httpcaddyfile.Helper, opt string, zeroOK bool) (time.Duration, error) {
	v, err := oneArg(h, opt, "a duration such as 30s")
	if err != nil {
		return 0, err
	}
	d, err := caddy.ParseDuration(v)
	if err != nil || d < 0 || (d == 0 && !zeroOK) {
		want := "a positive duration such as 30s"
		if zeroOK {
			want = "a duration such as 30s, or 0"
		}
		return 0, h.Errf("inflight: %s %q is not allowed: want %s", opt, v, want)
	}
	return d, nil
}

// shortForms writes placeholder arguments as the user wrote them: Caddy
// expands the shorthands before the directive sees its tokens.
func shortForms(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = inflight.ShortForm(a)
	}
	return out
}
