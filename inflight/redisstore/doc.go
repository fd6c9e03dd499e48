// Package redisstore is the inflight store `redis`
// (http.handlers.inflight.stores.redis): it keeps a zone's counts in Redis,
// so that one cap holds across a fleet of Caddy instances.
//
// Each slot held is a lease: a member of a sorted set per key (and one for
// the zone's total), scored by its expiry on Redis's own clock. Admission
// is one script, atomic, for a batch of requests: drop expired leases,
// check every set, add the lease to all of a request's sets or to none.
//
// Files: module.go is the Caddy module (config, Caddyfile, lifetime);
// book.go a Redis setup's client and this instance's leases (renewal,
// release, outage); scripts.go the Lua scripts and what they return;
// clock.go the scripts' deadlines in Redis's clock;
// zone.go one zone's admission and release; queue.go its waiters;
// logger.go routes go-redis's log lines about the store into Caddy's log;
// check.go the startup check and the reasons failures are logged with.
//
// Invariants:
//   - A book records a lease only once Redis granted it, or once the
//     local zone admitted its request while Redis was unreachable (on_error
//     open). Until its request ends, renewal writes every recorded lease
//     into Redis every lease/3, re-creating it if Redis lost it (FLUSHALL,
//     a restart, a failover) and entering locally admitted ones, so the
//     fleet's counts are whole again within one renewal interval.
//   - Every script that writes leases carries a deadline, in Redis's own
//     clock (clock.go): the caller's timeout, mapped through the Redis
//     TIME earlier replies carried, never later than the caller's. Past
//     it the script writes nothing, however long it waited in a socket (a
//     stopped Redis). An admission whose reply does not come within
//     timeout may still have run before its deadline: its members are
//     removed on every renewal tick until such a lease would have expired
//     (lease + timeout), so such a ghost holds a slot for at most one
//     renewal interval after it appears, whatever the stall's length. So
//     are, once released, the leases a failed renewal wrote.
//   - Renewal and the Redis side of release run in goroutines of their
//     own, so a slow renewal does not hold releases back. A lease released
//     while a renewal that wrote it was under way is removed once more
//     after that renewal, so it never stays in Redis after its removal.
//     Release takes the local count back at once; the Redis round trip
//     happens off the response path, and is retried on every tick until
//     it succeeds or the lease has expired anyway. Until then, each
//     admission in the zone removes those leases first, so a release is
//     never late for this instance's next admission.
//   - A book (and its client) lives while a config uses it, any of its
//     leases remain, a request is in its Acquire (waiting or not) or a
//     dispatch or renewal is under way: a reload that changes any option
//     keeps admitting, renewing, releasing and dispatching for the requests
//     of the old config. Its client closes only when all of these are
//     gone, checked under one lock; a request that reaches an old config's
//     handler later (Caddy does not wait for the old servers) opens it
//     again until that request is over.
//   - Only Redis failing makes Redis count as down: a client's own
//     cancellation never does (Redis calls do not inherit the request's
//     cancellation). An outage is logged once when it starts and once when
//     it ends; the first failure of each other operation in it is logged
//     too, so that every failure the metrics count (by zone) has a line
//     naming its zones and reason.
//   - While this instance has waiters in a zone, it is listed in the
//     zone's waiting set (refreshed by every dispatch), and a release
//     publishes a notice only while that set is not empty. Newcomers are
//     admitted behind this instance's waiters, in the same batch.
package redisstore
