package redisstore

import "github.com/caddy-inflight/caddy-inflight/inflight/storestatus"

// Health reports, for the admin API, whether Redis answered the latest
// operation of the zone's book (an outage lasts from a failure until
// Redis answers again).
func (z *redisZone) Health() storestatus.Health {
	return storestatus.Health{Type: "redis", Reachable: !z.book.outage.Load() && z.book.available()}
}

var _ storestatus.Reporter = (*redisZone)(nil)
