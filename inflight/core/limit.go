package core

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// totalName is the limit name the total cap reports as.
const totalName = "total"

// Limit is one dimension of a handler: units with the same evaluated key
// share its cap.
type Limit struct {
	// Name identifies the limit in metrics, logs, events and the
	// `{http.inflight.limit}` placeholder when it refuses a request. Letters,
	// digits, `_` and `-`; `total` is reserved for the handler's total cap.
	Name string `json:"name"`

	// Key is a placeholder template evaluated per unit; units with the
	// same value share the limit's slots. A key without placeholders makes
	// one counter for every unit. A unit whose key evaluates to empty is
	// not limited by this limit. Default: the client's IP address
	// (`{http.vars.client_ip}`, `{l4.conn.remote_ip}` for layer4).
	Key string `json:"key,omitempty"`

	// Max is how many units with the same key may be in flight at once:
	// an integer from 1 to 2^40-1, or (HTTP only) a placeholder string
	// that resolves to one per request (for example an output of the `map`
	// handler). A request whose placeholder does not resolve to a positive
	// integer is answered with 500.
	Max Max `json:"max"`
}

// Max is a limit's cap: a fixed positive integer, or a placeholder resolved
// per request. In JSON it is a number or a string.
type Max struct {
	Fixed       int64
	Placeholder string
}

// ParseMax reads a max as written in a Caddyfile or a JSON string.
func ParseMax(s string) (Max, error) {
	if strings.Contains(s, "{") {
		return Max{Placeholder: s}, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > limiter.MaxCost {
		return Max{}, fmt.Errorf("max %q is not allowed: want %s, or a placeholder such as {tenant_max}", s, CapRange)
	}
	return Max{Fixed: n}, nil
}

// IsZero reports whether no max was given.
func (m Max) IsZero() bool { return m.Fixed == 0 && m.Placeholder == "" }

// MarshalJSON writes a fixed max as a number and a placeholder as a string.
func (m Max) MarshalJSON() ([]byte, error) {
	if m.Placeholder != "" {
		return json.Marshal(m.Placeholder)
	}
	return json.Marshal(m.Fixed)
}

// UnmarshalJSON reads a number or a string.
func (m *Max) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := ParseMax(s)
		*m = v
		return err
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("max %s is not allowed: want a positive integer or a placeholder string", b)
	}
	v, err := ParseMax(n.String())
	*m = v
	return err
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// CheckLimitName reports whether name can name a limit.
func CheckLimitName(name string) error {
	switch {
	case !namePattern.MatchString(name):
		return fmt.Errorf("name %q is not allowed: want letters, digits, '_' or '-'", name)
	case name == totalName:
		return fmt.Errorf("name %q is reserved for the total cap: choose another", name)
	}
	return nil
}

// checkLimits reports the first badly formed limit.
func checkLimits(limits []Limit) error {
	seen := make(map[string]bool, len(limits))
	for i, l := range limits {
		if err := CheckLimitName(l.Name); err != nil {
			return fmt.Errorf("limits[%d]: %v", i, err)
		}
		switch {
		case seen[l.Name]:
			return fmt.Errorf("limits[%d]: name %q is used twice: each limit needs its own name", i, l.Name)
		case l.Max.IsZero():
			return fmt.Errorf("limit %q: max is missing: want a positive integer or a placeholder", l.Name)
		case l.Max.Fixed < 0 || l.Max.Fixed > limiter.MaxCost:
			return fmt.Errorf("limit %q: max %d is not allowed: want %s, or a placeholder", l.Name, l.Max.Fixed, CapRange)
		}
		seen[l.Name] = true
	}
	return nil
}
