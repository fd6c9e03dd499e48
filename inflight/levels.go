package inflight

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// The fields that show a client its own level (limit_headers), shaped
// after the IETF draft "RateLimit header fields for HTTP"
// (draft-ietf-httpapi-ratelimit-headers): a quota policy per limit, with
// no time window since the quota is of requests at once, and what is left
// of it.
const (
	policyField = "RateLimit-Policy"
	levelField  = "RateLimit"
	// quotaUnit is the draft's quota unit for a cap on requests in flight
	// (draft 12's registry: "request", "content-bytes",
	// "concurrent-requests", and the value must be one of them); with a
	// cost the unit is the operator's (tokens, say), which the registry
	// has no name for, and "concurrent-requests" would misstate q (units,
	// not requests), so none is sent.
	quotaUnit = "concurrent-requests"
	// localScope marks, with a store, a level that is this instance's
	// alone: the store could not answer and fails open, so the instance
	// enforces its share of each cap alone. The draft allows other
	// parameters, prefixed with a vendor's name.
	localScope = `;inflight-scope="instance"`
)

// compileLimitHeaders resolves limit_headers to dimensions. A name that is
// neither one of the handler's limits nor its total is a configuration
// error. With a shared store the levels are the fleet's (see sendLevels).
func (h *Handler) compileLimitHeaders() error {
	var err error
	h.levels, err = h.limitLevels()
	h.shared = h.StoreRaw != nil
	return err
}

// CheckLimitHeaders refuses a name in LimitHeaders that is neither one of
// the handler's limits nor total (with a total), or that is given twice.
func (h *Handler) CheckLimitHeaders() error {
	_, err := h.limitLevels()
	return err
}

// limitLevels returns the dimensions LimitHeaders names, in its order.
func (h *Handler) limitLevels() ([]int, error) {
	allowed := make([]string, 0, len(h.Limits)+1)
	for _, l := range h.Limits {
		allowed = append(allowed, l.Name)
	}
	hasTotal := h.Total > 0 || h.TotalAdaptive != nil
	if hasTotal {
		allowed = append(allowed, totalName)
	}
	var levels []int
	for _, name := range h.LimitHeaders {
		d := slices.IndexFunc(h.Limits, func(l core.Limit) bool { return l.Name == name })
		switch {
		case name == totalName && hasTotal:
			d = limiter.TotalDim
		case d < 0:
			return nil, fmt.Errorf("limit_headers %q is not allowed: want the names of this handler's limits %q", name, allowed)
		}
		if slices.Contains(levels, d) {
			return nil, fmt.Errorf("limit_headers %q is given twice: name each limit once", name)
		}
		levels = append(levels, d)
	}
	return levels, nil
}

// sendLevels sets the RateLimit fields of a's response: per limit named in
// limit_headers, its cap for a's key and the units the key has left. A
// limit the request's key does not apply to (an empty key) is left out,
// and so is a total without a cap (an adaptive total in dry_run). Nothing
// is sent for a client that left while waiting: nobody reads a response.
//
// With a shared store the level is the fleet's, as the store's ledger
// answered the call that decided a (res.Levels), or, for a request
// admitted within this instance's allowance, its latest call for that
// key: the fleet's cap and the units held across the fleet; a limit the
// ledger did not read (one after the limit that refused a) is left out.
// While the store cannot answer and fails open (res.Alone), the level is
// this instance's, its share of each cap, marked with localScope. Nothing is sent when no level is known (a
// refusal for max_keys, or by a store that fails closed).
func (h *Handler) sendLevels(w http.ResponseWriter, a *admission, res limiter.Result) {
	if h.levels == nil || res.Outcome == limiter.Aborted {
		return
	}
	levels, local := res.Levels, !h.shared || res.Alone
	var buf [4]limiter.Level // room for most handlers' limits and the total, on the stack
	switch {
	case local:
		levels = h.gate.Levels(&a.ticket, false, buf[:])
	case levels == nil && res.Outcome == limiter.Admitted: // within this instance's allowance
		levels = h.gate.Levels(&a.ticket, true, buf[:])
	}
	if levels == nil {
		return
	}
	var policy, level []byte
	for _, d := range h.levels {
		limit, key := totalName, ""
		if d != limiter.TotalDim {
			limit, key = h.Limits[d].Name, a.ticket.Req.Keys[d]
			if key == "" {
				continue
			}
		}
		l, ok := levels.Of(d)
		if !ok {
			continue
		}
		capacity, used := l.Cap, l.InFlight
		if policy != nil {
			policy, level = append(policy, ", "...), append(level, ", "...)
		}
		policy = strconv.AppendQuote(policy, limit)
		policy = strconv.AppendInt(append(policy, ";q="...), capacity, 10)
		if !h.costed() {
			policy = append(policy, `;qu="`+quotaUnit+`"`...)
		}
		if h.shared && local {
			policy = append(policy, localScope...)
		}
		level = strconv.AppendQuote(level, limit)
		level = strconv.AppendInt(append(level, ";r="...), max(capacity-used, 0), 10)
	}
	if policy != nil {
		w.Header().Set(policyField, string(policy))
		w.Header().Set(levelField, string(level))
	}
}
