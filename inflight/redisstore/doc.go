// Package redisstore is the inflight store `redis`
// (http.handlers.inflight.stores.redis): it keeps a zone's counts in Redis,
// so that one cap holds across a fleet of Caddy instances.
//
// Each request held is a lease: a member of a sorted set per key (and one
// for the zone's total), scored by its expiry on Redis's own clock, named
// after the units it holds; a set keeps in itself the units its leases
// hold beyond one each (see scripts.go). Admission
// is one script, atomic, for a batch of requests: drop expired leases,
// check that each set has room for the request's units, add the lease to
// all of a request's sets or to none. A zone makes one such call at a time:
// the requests that arrive meanwhile go together in the next one.
//
// A zone is a limiter.Ledger: it answers the claims of the engine's queue
// (limiter.SharedQueue), which orders the waiters, decides what room each
// holds, counts the admitted requests locally and applies max_keys; the
// store never calls into the engine.
//
// Files: module.go is the Caddy module (config, Caddyfile, lifetime);
// book.go a Redis setup's client and this instance's leases (renewal,
// release, outage); scripts.go the Lua scripts and what they return;
// fairclock.go the zone's fair clock, kept by the admission script, and
// what fair claims send it; clock.go the scripts' deadlines in Redis's
// clock;
// zone.go one zone's claims as sets and members, and its admission call;
// ledger.go the Ledger's methods, and the removal of ended leases;
// logger.go routes go-redis's log lines about the store into Caddy's log;
// check.go the startup check and the reasons failures are logged with.
//
// Invariants:
//   - Cost conservation: a request takes the same units in every one of
//     its sets, its cost clamped to the smallest of the fleet's caps it is
//     checked against (so a cost above a cap is admitted alone once the cap
//     is free). The units are fixed before the script, carried by the lease
//     (its member's name ends with them) and counted locally as the same
//     units, so every release, renewal and removal gives back or enters
//     exactly those. A waiter's grant passes its units to the request the
//     caller releases.
//   - A set's units are its leases, one each, plus the units they carry
//     beyond one, kept as minus the score of the set's member "~u" (absent
//     at 0): every script that adds a lease (admission, or renewal
//     re-creating one Redis lost) adds its units beyond one in the same
//     script, and every removal (release, ghost removal, the admission's
//     removal of expired leases, which reads their units first) takes them
//     away only for a lease it did remove, so a lease removed twice, or
//     removed after it expired, is taken away once; a late script writes
//     nothing past its deadline, or writes lease and units together. The
//     count lives in its set, so they expire and are evicted together.
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
//     removed at once, then on every renewal tick (and once Redis answers
//     after an outage, not at every probe) until such a lease would have expired
//     (lease + timeout), so such a ghost holds a slot for at most one
//     renewal interval after it appears, plus the removal's round trip
//     (timeout at most), whatever the stall's length. So are, once
//     released, the leases a failed renewal wrote. An admission whose
//     connection broke under it (a reset, EOF) is first sent again, once,
//     marked so: a request whose member the first call wrote is admitted
//     with that lease, nothing written or charged twice, and the others
//     are decided then (or the call is late), so a lost reply leaves no
//     ghost when Redis answers the second time.
//   - Renewal and the Redis side of release run in goroutines of their
//     own, so a slow renewal does not hold releases back. A lease released
//     while a renewal that wrote it was under way is removed once more
//     after that renewal, so it never stays in Redis after its removal,
//     however many scripts removed it before (each script counts itself
//     out of the lease when it ends, even once the lease is forgotten).
//     Release takes the local count back at once; the Redis round trip
//     happens off the response path: the zone's next admission call
//     removes the lease before it admits, or, if no call is under way, a
//     removal of its own. Each ended lease is sent by one script at a time
//     (but for an admission call that may overtake a removal of its own:
//     it sends the lease too) and forgotten once a reply confirmed its
//     removal; one whose script failed is sent again by a later call, or
//     on a tick once timeout passed, until it is removed or has expired
//     anyway. As a zone makes one admission call at a time, a release is
//     never late for this instance's next admission.
//   - A zone makes one admission call at a time. Newcomers that arrive
//     while one is under way wait for it and go together in the next, one
//     script (a lone request goes at once); waiters go first in every call,
//     so a newcomer never overtakes a waiter that fits. A call that fails
//     fails each of its newcomers as a lone admission would (fallback, its
//     members removed as ghosts); newcomers that waited for a call that
//     failed fall back at once, as Redis is then left alone for a second.
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
//     publishes a notice only while that set lists an instance whose
//     listing has not expired.
package redisstore
