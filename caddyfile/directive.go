// Package caddyfile registers the `inflight` and `inflight_ui` Caddyfile
// directives and their default places in the directive order.
package caddyfile

import (
	"math"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/caddy-inflight/caddy-inflight/caddyfile/options"
	"github.com/caddy-inflight/caddy-inflight/inflight"
	"github.com/caddy-inflight/caddy-inflight/inflight/core"
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

// read reads the arguments of the HTTP options, and shows placeholders
// in messages with the Caddyfile's shorthands.
var read = options.Reader{Show: inflight.ShortForm}

// adaptWarning, if set, receives the directive's warnings instead of the
// log: tests set it to see them.
var adaptWarning func(caddyconfig.Warning)

// subdirectives lists the block's options, for error messages.
const subdirectives = "limit, total, cost, zone, status, retry_after, retry_after_ms, dry_run, replicas, wait, max_waiting, priority, max_keys, metrics, store, fair, weight, max_waiting_per_key, wait_body_buffer, limit_headers, deadline, early_refusal, grpc_status"

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
//			default_output  <n>|auto [<n>] # output tokens when the body names none (1024); auto: learned, at most <n>
//			max_body        <size>       #   body read at most (1MiB)
//			include_usage                #   ask OpenAI chat streams for their usage, filtered out for the client
//		}]
//		zone        <name>               # share counters with handlers naming it
//		status      <code>               # refusal status, 400-599 (429)
//		retry_after <duration>           # Retry-After of refusals (1s)
//		retry_after_ms <duration>|auto   # retry-after-ms beside it, for LLM SDKs (none)
//		grpc_status <status>             # gRPC refusals: resource_exhausted | unavailable (resource_exhausted)
//		dry_run                          # count and report, never refuse
//		replicas    <n>                  # each of n instances enforces ceil(max/n)
//		wait        <duration>           # wait for a slot instead of refusing (0)
//		max_waiting <n>                  # bound on waiting requests (1000)
//		max_waiting_per_key <n>          # bound on waiting requests of one key
//		wait_body_buffer <size>          # body read ahead per waiting request (64KiB)
//		deadline    <placeholder>        # the client's time left: wait ends a margin before
//		early_refusal                    # refuse at once a wait its deadline won't see end
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
	err := options.ParseBlock(h.Dispenser, &hd.Config, options.Block{
		Reader:        read,
		DefaultKey:    inflight.DefaultKey,
		Subdirectives: subdirectives,
		Placeholder:   "{tenant_*}",
		OtherTotal:    func() bool { return hd.TotalAdaptive != nil },
		Own: func(_ *caddyfile.Dispenser, opt string) (bool, error) {
			return parseHTTPOption(h, hd, opt)
		},
		Done: func(written options.Written) error { return checkHTTP(hd, written) },
		Warn: adaptWarning,
	})
	if err != nil {
		return nil, err
	}
	return hd, nil
}

// checkHTTP makes the checks of the HTTP options that need the whole
// block, at the line of the option they refuse or warn of.
func checkHTTP(hd *inflight.Handler, written options.Written) error {
	if err := hd.CheckRetryAfterMs(); err != nil {
		return written.At("retry_after_ms").Errf("inflight: %v", err)
	}
	if err := hd.CheckLimitHeaders(); err != nil {
		return written.At("limit_headers").Errf("inflight: %v", err)
	}
	for _, n := range hd.HTTPNotices() {
		written.Warn(n.Setting, n.String())
	}
	return nil
}

// parseHTTPOption reads one of the options only HTTP has, and reports
// whether opt is one.
func parseHTTPOption(h httpcaddyfile.Helper, hd *inflight.Handler, opt string) (bool, error) {
	var err error
	switch opt {
	case "total": // a number, as every protocol's, or adaptive
		err = parseTotal(h, hd)
	case "cost":
		err = parseCost(h, hd)
	case "status":
		hd.StatusCode, err = statusCode(h)
	case "retry_after":
		var d time.Duration
		d, err = read.Duration(h.Dispenser, opt, false)
		hd.RetryAfter = caddy.Duration(d)
	case "retry_after_ms": // checked against retry_after once the block is read
		hd.RetryAfterMs, err = read.OneArg(h.Dispenser, opt, "auto or a duration such as 250ms")
	case "wait_body_buffer":
		hd.WaitBodyBuffer, err = byteSize(h, opt)
	case "grpc_status":
		hd.GRPCStatus, err = grpcStatus(h)
	case "limit_headers":
		err = parseLimitHeaders(h, hd)
	case "deadline":
		hd.Deadline, err = parseDeadlineOption(h)
	case "early_refusal":
		if h.NextArg() {
			return true, h.Errf("inflight: early_refusal takes no arguments, got %q", h.Val())
		}
		hd.EarlyRefusal = true
	case "bytes_per_token", "default_output", "max_body", "include_usage":
		err = h.Errf("inflight: %s is an option of cost tokens: write it in its block, cost tokens { %s … }", opt, opt)
	case "store": // the shared option, but not beside an adaptive total
		if hd.TotalAdaptive == nil {
			return false, nil
		}
		err = h.Errf("inflight: %v", inflight.ErrAdaptiveWithStore)
	default:
		return false, nil
	}
	return true, err
}

// parseDeadlineOption reads `deadline <placeholder>`, or a fixed deadline.
func parseDeadlineOption(h httpcaddyfile.Helper) (string, error) {
	args := h.RemainingArgs()
	if len(args) != 1 {
		return "", h.Errf("inflight: deadline %q: want one argument, a placeholder such as {header.X-Request-Timeout} that resolves to a duration (300ms) or seconds (0.3) per request", read.Shown(args))
	}
	if err := inflight.CheckDeadline(args[0]); err != nil {
		return "", h.Errf("inflight: %v", err)
	}
	return args[0], nil
}

// parseLimitHeaders reads `limit_headers <limit>...`; the names are
// checked once the block is read.
func parseLimitHeaders(h httpcaddyfile.Helper, hd *inflight.Handler) error {
	hd.LimitHeaders = h.RemainingArgs()
	if len(hd.LimitHeaders) == 0 {
		return h.Err("inflight: limit_headers: want the names of one or more of this block's limits, or total")
	}
	return nil
}

// parseTotal reads `total <max>` or `total adaptive [{ ... }]`.
func parseTotal(h httpcaddyfile.Helper, hd *inflight.Handler) error {
	args := h.RemainingArgs()
	if len(args) != 1 {
		return h.Errf("inflight: total %q: want one argument, a positive integer or adaptive", args)
	}
	if args[0] != "adaptive" {
		n, ok := options.FixedCap(args[0])
		if !ok {
			return h.Errf("inflight: total %q is not allowed: want %s, or adaptive", args[0], core.CapRange)
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
			at.Min, err = read.PositiveInt(h.Dispenser, "total adaptive: "+opt)
		case "max":
			at.Max, err = read.PositiveInt(h.Dispenser, "total adaptive: "+opt)
		case "initial":
			at.Initial, err = read.PositiveInt(h.Dispenser, "total adaptive: "+opt)
		case "tolerance":
			at.Tolerance, err = tolerance(h)
		case "window":
			var d time.Duration
			d, err = read.Duration(h.Dispenser, "total adaptive: window", false)
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
	v, err := read.OneArg(h.Dispenser, "total adaptive: tolerance", "a fraction such as 0.2")
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

// byteSize reads a positive size in bytes, such as 65536, 64KiB or 1MB.
func byteSize(h httpcaddyfile.Helper, opt string) (int, error) {
	v, err := read.OneArg(h.Dispenser, opt, "a size such as 64KiB")
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
	v, err := read.OneArg(h.Dispenser, "status", "a status code 400-599")
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 400 || n > 599 {
		return 0, h.Errf("inflight: status %q is not allowed: want a status code 400-599", v)
	}
	return n, nil
}
