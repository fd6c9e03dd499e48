package redisstore

import (
	"github.com/redis/go-redis/v9"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// Every script reads the time from Redis, so the instances' clocks need not
// agree, and touches the keys of one zone only: one Redis Cluster slot.
// The scripts that write leases first check their deadline (Redis time,
// µs; see clock.go): past it they write nothing and answer an error
// "LATE <seconds> <microseconds>". Otherwise their reply starts with
// Redis's TIME (seconds, microseconds).

// A lease's member is "<instance>:<sequence>:<units>", its score its
// expiry (Redis time, ms): a set's expired members are given back by
// their units, read from their names. A set holds one unit per lease,
// plus what its leases carry beyond one, kept in the set itself: the
// member "~u", whose score is minus those units, is there only while they
// are not 0 (no instance's name starts with "~"). So a set and its count
// live, expire and are evicted together, a set of leases of one unit has
// no count to keep, and an admission into an empty set reads one key and
// writes it (ZCARD, ZADD, PEXPIRE); its release is one ZREM. Leases'
// scores are above 0 and the count's below, so one range, (-inf, now],
// reads a set's count and its expired leases together, and (0, now]
// removes the expired leases alone.
const countMember = "~u"

const countersLua = `
local countMember = '` + countMember + `'
-- giveBack takes from key's count the units beyond one of members that left.
local function giveBack(key, extra)
	if extra > 0 and tonumber(redis.call('ZINCRBY', key, extra, countMember)) >= 0 then redis.call('ZREM', key, countMember) end
end
local function unitsOf(member)
	return tonumber(string.match(member, ':(%d+)$')) or 1
end
`

// admitScript first removes leases of this instance that ended (announcing
// it if anyone waits), then admits, in order, each of a batch of requests
// whose units fit in every one of its sorted sets (the units held, from
// the set's count, plus the request's, at most the set's max): all of
// its sets or none. It answers, after the time, per request the 1-based
// position among its sets of the one that was full, or 0 when it was
// admitted; then, per request and per set of it, the units the set holds
// once the request is decided (its own included if admitted; -1 for a set
// the script did not read: one after the set that refused it, or one held
// for a waiter before it); it reads nothing more for them, only the reply
// grows (decoded into verdicts by decodeVerdicts). A set that refused
// a request that will wait, and each set that request holds (those that
// refused it before), refuse every later request of the call that needs
// them: what the first waits for is not taken by those behind it (see
// limiter.Ledger). The queue decides what each request holds; the script
// applies it because only Redis sees, within the one round trip of the
// call, which set is full. If a request that will wait was refused, the instance
// is listed in the waiting set, so that releases anywhere announce
// themselves.
//
// A fair request also goes by the zone's fair clock (see fairLua), after
// its counts: it is refused by the first of its sets under which another
// key is listed with a smaller tag than its key starts at, which it does
// not hold for the later requests (the room is the other key's); if it
// waits, its key is listed under the set that refused it. Admitted, its
// key is charged and unlisted.
//
// A call can be sent again, once, with the same arguments but again set,
// when its connection broke under it (see admit): it may have run. Sent
// again, a request whose member is in its first set was admitted by the
// call it repeats: it is admitted again with nothing written or charged
// (its lease is the one that call wrote). The removals are idempotent.
// Others are decided afresh.
//
// KEYS[1]: the zone's waiting set; KEYS[2] to KEYS[4]: its fair clock
// (see fairLua); the rest: the sorted sets. ARGV: the deadline (µs), the
// lease (ms), how long a waiting listing lasts (ms), the instance, the
// channel, again (1 if the call is sent again), the number of groups of
// leases to remove, then per group
// (leases of one set and of the same units, one ZREM) the set's index in
// KEYS, the units, the number of members and the members; then how long a
// fair listing lasts (ms), how long the fair clock outlives its last call
// (ms), the weight waiting in the instance, the number of fair requests,
// the number of corrections and per correction a fair key and how far its
// tag moves; then the number of
// requests, then per request its member, 1 if it waits when refused, its
// units, its number of sets, its fair key ("" if none), weight, work and 1
// if more of its key wait here (limiter.FairClaim), and per set its index
// in KEYS, its max and 1 if the request holds it.
// The members admitted go into each set in one ZADD.
var admitScript = redis.NewScript(countersLua + fairLua + `
local call, tonumber = redis.call, tonumber
local t = call('TIME')
if tonumber(t[1]) * 1000000 + tonumber(t[2]) > tonumber(ARGV[1]) then
	return redis.error_reply('LATE ' .. t[1] .. ' ' .. t[2])
end
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease, listing, instance, channel, again = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6] == '1'
-- Numbers given to redis.call are formatted by Redis, each time: those
-- sent per request are formatted once here.
local nowS, expiry, ttl = string.format('%d', now), string.format('%d', now + lease), string.format('%d', 2 * lease)
local pos, removed, freed = 8, 0, {}
for i = 1, tonumber(ARGV[7]) do
	local key, units, count = KEYS[tonumber(ARGV[pos])], tonumber(ARGV[pos + 1]), tonumber(ARGV[pos + 2])
	local n = 0
	for lo = pos + 3, pos + 2 + count, 512 do -- unpack is bounded by Lua's stack
		n = n + call('ZREM', key, unpack(ARGV, lo, math.min(lo + 511, pos + 2 + count)))
	end
	removed = removed + n
	if units > 1 then freed[key] = (freed[key] or 0) + n * (units - 1) end
	pos = pos + 3 + count
end
for key, units in pairs(freed) do giveBack(key, units) end
if removed > 0 and call('ZCOUNT', KEYS[1], '(' .. nowS, '+inf') > 0 then
	call('PUBLISH', channel, '1')
end
-- held: the units in each set, once its expired members are given back:
-- its members, less the count's, plus the units the count keeps (minus
-- its score; it sorts first).
local held, members, reserved = {}, {}, {}
local function heldIn(key)
	local n = call('ZCARD', key)
	if n > 0 then
		local low = call('ZRANGEBYSCORE', key, '-inf', nowS, 'WITHSCORES')
		local first, extra = 1, 0
		if low[1] == countMember then first, n = 3, n - 1 - tonumber(low[2]) end
		if #low >= first then
			for i = first, #low, 2 do extra = extra + unitsOf(low[i]) end
			call('ZREMRANGEBYSCORE', key, '(0', nowS)
			giveBack(key, extra - (#low - first + 1) / 2)
			n = n - extra
		end
	end
	held[key] = n
	return n
end
local fair = nil -- a call with no fair request and no correction leaves the clock alone
if tonumber(ARGV[pos + 3]) + tonumber(ARGV[pos + 4]) > 0 then fair = fairClock(now, ARGV, pos, instance) end
pos = pos + 5 + 2 * tonumber(ARGV[pos + 4])
local n = tonumber(ARGV[pos])
pos = pos + 1
-- sets: the sets of the request at hand, read once.
local out, waits, level, sets = {tonumber(t[1]), tonumber(t[2])}, false, n + 2, {}
for r = 1, n do out[r + 2] = 0 end
for r = 1, n do
	local member, willWait, units, count, fk = ARGV[pos], ARGV[pos + 1] == '1', tonumber(ARGV[pos + 2]), tonumber(ARGV[pos + 3]), ARGV[pos + 4]
	local first = pos + 8
	pos = first + 3 * count
	for j = 1, count do sets[j] = KEYS[tonumber(ARGV[first + 3 * j - 3])] end
	local full, start = 0, nil
	local had = again and count > 0 and call('ZSCORE', sets[1], member)
	for j = 1, count do
		local key = sets[j]
		if had then
			if not held[key] then heldIn(key) end
		elseif reserved[key] or (held[key] or heldIn(key)) + units > tonumber(ARGV[first + 3 * j - 2]) then
			full = j
			break
		end
	end
	local byClock, listed, contended = false, nil, nil
	if fk ~= '' then -- the key's own set is left out: no other key contends there
		contended = {}
		for j = 1, count do contended[j] = string.sub(sets[j], -#fk - 1) ~= ':' .. fk and sets[j] end
	end
	if full == 0 and fk ~= '' and not fair.idle and not had then
		start, listed = fair.start(fk), fair.listed(fk)
		for j = 1, count do
			if contended[j] and fair.before(contended[j], fk, listed or start) then
				full, byClock = j, true
				break
			end
		end
	end
	if full > 0 and willWait and fk ~= '' and contended[full] then fair.list(contended[full], fk) end
	if full > 0 and willWait and not byClock then
		for j = 1, count do
			if j == full or ARGV[first + 3 * j - 1] == '1' then reserved[sets[j]] = true end
		end
	end
	if had then -- held already, by the lease the call it repeats wrote
	elseif full == 0 then
		if start then fair.charge(fk, start, tonumber(ARGV[first - 3]), tonumber(ARGV[first - 2]), listed and contended, ARGV[first - 1] == '1') end
		for j = 1, count do
			local key = sets[j]
			held[key] = held[key] + units
			local m = members[key]
			if not m then m = {0}; members[key] = m end
			m[1] = m[1] + units
			m[#m + 1], m[#m + 2] = expiry, member
		end
	elseif willWait then
		waits = true
	end
	out[r + 2] = full
	for j = 1, count do
		level = level + 1
		out[level] = held[sets[j]] or -1
	end
end
-- members[key]: the units admitted into key, then its new leases' scores
-- and members.
for key, m in pairs(members) do
	for lo = 2, #m, 512 do call('ZADD', key, unpack(m, lo, math.min(lo + 511, #m))) end
	local leases = (#m - 1) / 2
	if m[1] > leases then call('ZINCRBY', key, leases - m[1], countMember) end
	call('PEXPIRE', key, ttl)
end
if waits then
	call('ZADD', KEYS[1], now + listing, instance)
	call('PEXPIRE', KEYS[1], listing)
end
if fair then fair.close() end
return out
`)

// decodeVerdicts turns the admission script's reply (after the time) into
// verdicts: Admitted, or Full by a dimension (limiter.TotalDim: the
// total), each with the units held in its sets (Verdict.Held, by
// dimension; -1 where not read). dims gives, per request, the dimension of
// each of its sets, and keys its number of dimensions (the total's units
// go after them).
func decodeVerdicts(reply []int64, dims [][]int, keys []int) []limiter.Verdict {
	out := make([]limiter.Verdict, len(dims))
	levels := reply[len(dims):]
	for i, full := range reply[:len(dims)] {
		v := limiter.Verdict{Outcome: limiter.Admitted}
		if full != 0 {
			v = limiter.Verdict{Outcome: limiter.Full, Dim: dims[i][full-1]}
		}
		if len(levels) >= len(dims[i]) {
			v.Held = make([]int64, keys[i]+1)
			for d := range v.Held {
				v.Held[d] = -1
			}
			for k, d := range dims[i] {
				if d == limiter.TotalDim {
					d = keys[i]
				}
				v.Held[d] = levels[k]
			}
			levels = levels[len(dims[i]):]
		}
		out[i] = v
	}
	return out
}

// releaseScript removes leases from their sets, giving back their units
// (only those of a member it removed: one expired or removed before gave
// them back already), and, if any instance has waiters in the zone,
// announces that units freed. It answers how many members it removed.
//
// KEYS[1]: the zone's waiting set; the rest: sets, one per lease. ARGV:
// the channel, then per lease its member and its units.
var releaseScript = redis.NewScript(countersLua + `
local removed, freed = 0, {}
for i = 2, #KEYS do
	if redis.call('ZREM', KEYS[i], ARGV[2 * i - 2]) == 1 then
		removed = removed + 1
		freed[KEYS[i]] = (freed[KEYS[i]] or 0) + tonumber(ARGV[2 * i - 1]) - 1
	end
end
for key, units in pairs(freed) do giveBack(key, units) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if removed > 0 and redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf') > 0 then redis.call('PUBLISH', ARGV[1], '1') end
return removed
`)

// renewScript writes leases with a new expiry, re-creating those Redis
// lost (and counting their units again). It answers, after the time, how
// many it re-created.
//
// KEYS: sets, one per lease. ARGV: the deadline (µs), the lease (ms), then
// per lease its member and its units.
var renewScript = redis.NewScript(countersLua + `
local t = redis.call('TIME')
if tonumber(t[1]) * 1000000 + tonumber(t[2]) > tonumber(ARGV[1]) then
	return redis.error_reply('LATE ' .. t[1] .. ' ' .. t[2])
end
local lease = tonumber(ARGV[2])
local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + lease
local created, touched = 0, {}
for i, key in ipairs(KEYS) do
	if redis.call('ZADD', key, expiry, ARGV[2 * i + 1]) == 1 then
		created = created + 1
		local extra = tonumber(ARGV[2 * i + 2]) - 1
		if extra > 0 then redis.call('ZINCRBY', key, -extra, countMember) end
	end
	touched[key] = true
end
for key in pairs(touched) do redis.call('PEXPIRE', key, 2 * lease) end
return {tonumber(t[1]), tonumber(t[2]), created}
`)

// entries are leases of one zone, in the shape the release and renewal
// scripts take them: per lease one of its sets (in keys) and its member
// and units (in args).
type entries struct {
	keys []string
	args []any
}

func (e *entries) add(set, member string, units int64) {
	e.keys = append(e.keys, set)
	e.args = append(e.args, member, units)
}

// chunk returns the entries lo to hi (excluded).
func (e *entries) chunk(lo, hi int) ([]string, []any) { return e.keys[lo:hi], e.args[2*lo : 2*hi] }

// group is leases of one set and of the same units: one ZREM removes them.
type group struct {
	set     string
	units   int64
	members []any
}

// groups returns e's leases by set and units, in the order they first
// appear.
func (e *entries) groups() []*group {
	type by struct {
		set   string
		units int64
	}
	index := map[by]*group{}
	var out []*group
	for i, set := range e.keys {
		k := by{set, e.args[2*i+1].(int64)}
		g := index[k]
		if g == nil {
			g = &group{set: set, units: k.units}
			index[k] = g
			out = append(out, g)
		}
		g.members = append(g.members, e.args[2*i])
	}
	return out
}
