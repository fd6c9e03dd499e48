// Package redisstore is the inflight store `redis`
// (http.handlers.inflight.stores.redis): the ledger a fleet of Caddy
// instances shares, so that one cap holds across them.
//
// The engine (limiter.Zone) admits each request locally, within
// allowances: units of a set (a limit's key, or the zone's total) that the
// ledger counts for this instance, in flight or idle. A zone's ledger here
// keeps, per set, each instance's allowance and each waiting instance's
// report in one Redis hash, and applies the zone's calls (fleet.Call) with
// the rules of internal/fleetref, one script a call: what the zone writes
// back, what it reports while it waits, what it wants. The store never
// calls into the engine; it only wakes the zone's asker when another
// instance announces something.
//
// Files: module.go is the Caddy module (config, Caddyfile, lifetime);
// book.go a Redis setup's client, shared by the zones on it, with the
// subscription to their notices and the outage state; ledger.go one
// zone's ledger (its calls, replies and notices); scripts.go the call
// script and the layout of a zone's keys; clock.go the scripts' deadlines
// in Redis's clock; probe.go the prober that ends an outage as soon as
// Redis answers; outagelog.go what the log says of outages; logger.go
// routes go-redis's log lines into Caddy's log; check.go the startup
// check and the reasons failures are logged with.
//
// Invariants:
//   - Exact: the script grants a want only where the allowances of the
//     set, with it, stay within the cap; a write that lowers an allowance
//     is always applied. The fleet admits over a cap nowhere, at any
//     moment, while Redis keeps its data.
//   - Every allowance is a lease: it lives until its expiry, renewed by
//     its instance's calls, so a dead instance's units come back within
//     one lease, and a hash whose fields all expired goes too.
//   - Every call carries a version, increasing per process, and a
//     deadline in Redis's own clock (clock.go): a script that ran late, or
//     after a later call of the same instance, writes nothing. A call that
//     gets no answer is followed, in the zone's next call, by every
//     allowance written again, so what a lost reply granted is given back
//     or kept as the zone holds it.
//   - Only Redis failing makes Redis count as down: a client's own
//     cancellation never does. After a failure Redis is left alone for a
//     second, or until it answers the prober if sooner; meanwhile a zone
//     admits within its unexpired allowances, then as on_error says. An outage is logged once when it
//     starts and once when it ends; the first failure of each other
//     operation in it is logged too, so that every failure the metrics
//     count (by zone) has a line naming its zones and reason.
//   - A book (and its client) lives while a config uses it or a call or
//     probe is under way: a reload that changes any option keeps the old
//     zones' calls going until they have given back what they hold.
package redisstore
