package core

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	"go.uber.org/zap"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// compileFair resolves `fair` to its limit and the per-key options of the
// queue. A bad name is a configuration error.
func (g *Gate) compileFair() error {
	c := g.cfg
	if c.MaxWaitingPerKey < 0 {
		return fmt.Errorf("max_waiting_per_key %d is not allowed: want a positive integer (0 for none)", c.MaxWaitingPerKey)
	}
	g.waitOpt.MaxWaitingPerKey = c.MaxWaitingPerKey
	if c.Fair == "" {
		return nil
	}
	if err := CheckFair(c.Fair, c.Limits); err != nil {
		return err
	}
	d := slices.IndexFunc(c.Limits, func(l Limit) bool { return l.Name == c.Fair })
	g.waitOpt.Fair, g.waitOpt.KeyDim = true, d
	if c.Weight == "" {
		return nil
	}
	if err := CheckWeight(c.Weight); err != nil {
		return err
	}
	g.weighted = true
	return nil
}

// parseWeight reads the value of the weight template: a positive number
// within limiter.MinWeight to MaxWeight; one outside counts as the nearest
// bound, anything else as 1, each logged once per distinct value.
func (g *Gate) parseWeight(v string) float64 {
	w, err := strconv.ParseFloat(v, 64)
	if errors.Is(err, strconv.ErrRange) { // ±Inf: out of range, not invalid
		err = nil
	}
	if err != nil || !(w > 0) {
		g.badValues.Log("weight", v, func(seen string) {
			g.logger.Warn("weight placeholder did not resolve to a positive number; counting 1",
				zap.String("weight", g.cfg.Weight), zap.String("value", seen))
		})
		return 1
	}
	if c := min(max(w, limiter.MinWeight), limiter.MaxWeight); c != w {
		g.badValues.Log("weight", v, func(seen string) {
			g.logger.Warn("weight placeholder resolved to a number out of range; counting the nearest bound",
				zap.String("weight", g.cfg.Weight), zap.String("value", seen), zap.Float64("counted", c),
				zap.Float64("min", limiter.MinWeight), zap.Float64("max", limiter.MaxWeight))
		})
		return c
	}
	return w
}
