package core

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// The checks below are made by the Caddyfile parser at the option's line,
// so that its error names file:line, and again when a handler joins its
// zone from JSON.

// CapRange says what a fixed cap (a max, a total) may be: a zone counts
// units in 40 bits, and a larger cap would overflow into its request count.
var CapRange = fmt.Sprintf("an integer from 1 to %d (2^40-1)", int64(limiter.MaxCost))

// CheckPriority refuses a priority that is neither a placeholder nor a
// class: a literal such as "urgent" would make every request normal.
func CheckPriority(p string) error {
	if p == "" || strings.Contains(p, "{") {
		return nil
	}
	for _, class := range []limiter.Class{limiter.High, limiter.Normal, limiter.Low} {
		if strings.EqualFold(p, class.String()) {
			return nil
		}
	}
	return fmt.Errorf("priority %q is not allowed: want high, normal or low, or a placeholder such as {tenant_priority}", p)
}

// CheckWeight refuses a fixed weight outside limiter.MinWeight to
// MaxWeight; a placeholder is resolved, and bounded, per request.
func CheckWeight(w string) error {
	if strings.Contains(w, "{") {
		return nil
	}
	if f, err := strconv.ParseFloat(w, 64); err != nil || !(f >= limiter.MinWeight && f <= limiter.MaxWeight) {
		return fmt.Errorf("weight %q is not allowed: want a number from %v to %v, or a placeholder such as {tenant_weight}", w, limiter.MinWeight, limiter.MaxWeight)
	}
	return nil
}

// CheckZone refuses a zone name with '#', the mark of the automatic names
// of unnamed zones.
func CheckZone(name string) error {
	if strings.Contains(name, "#") {
		return fmt.Errorf("zone %q is not allowed: '#' marks the automatic names of unnamed zones; choose a name without it", name)
	}
	return nil
}

// CheckFair refuses a fair that names none of the limits.
func CheckFair(fair string, limits []Limit) error {
	if fair != "" && !slices.ContainsFunc(limits, func(l Limit) bool { return l.Name == fair }) {
		return fmt.Errorf("fair %q is not allowed: want the name of one of this handler's limits %q", fair, names(limits))
	}
	return nil
}
