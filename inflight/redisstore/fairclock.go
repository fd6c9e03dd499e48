package redisstore

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// The zone's fair clock in Redis: what a fair claim sends (its key,
// weight, work), the corrections sent with a later call, and the script's
// part that keeps the clock (fairLua, run by the admission script).

// fairKey names key of dimension d on the zone's fair clock, as its set
// does after the zone's prefix. Keys are hashed: Redis never sees a raw
// key.
func (z *redisZone) fairKey(d int, key string) string {
	sum := sha256.Sum256([]byte(key))
	return z.limits[d] + ":" + hex.EncodeToString(sum[:12])
}

// Correct has the next call move key's tag on the zone's fair clock by
// delta.
func (z *redisZone) Correct(d int, key string, delta float64) {
	k := z.fairKey(d, key)
	z.callMu.Lock()
	if z.fixes == nil {
		z.fixes = map[string]float64{}
	}
	z.fixes[k] += delta
	z.callMu.Unlock()
}

// takeFixes returns the corrections to send, which a call that fails
// loses: a correction moves one grant's charge.
func (z *redisZone) takeFixes() map[string]float64 {
	z.callMu.Lock()
	defer z.callMu.Unlock()
	f := z.fixes
	z.fixes = nil
	return f
}

// fairOf returns the weight of the keys waiting under fair in this
// instance, as the fair claims of a call give it, and their number.
func fairOf(claims []limiter.Claim) (waiting float64, n int) {
	for _, c := range claims {
		if c.Fair != nil {
			waiting, n = c.Fair.Waiting, n+1
		}
	}
	return waiting, n
}

// fairLua is the zone's fair clock, the one of every instance: the
// engine's (limiter/fair.go), kept in Redis. KEYS[2] is a hash holding
// virtual time ("v") and, per instance with keys waiting, their weight
// and until when it counts ("a:<instance>" = "<weight> <ms>"); KEYS[3]
// the keys' tags, a sorted set. A tag at or below virtual time reads as
// none and is dropped. A key waiting anywhere has a place, "<KEYS[2]>:w",
// the start it had when it was first listed: it is listed, at that place,
// under each set that refused it, "<set>:fq". Places order the keys
// waiting as they started, and the same way under every set, so the key
// of the smallest place is refused by none: the clock never deadlocks.
// KEYS[4] holds when each listing ends, "<set>|<key>" ("|<key>": its
// place), scored by its expiry. A grant unlists its key, whose waiters
// list it again, at its new start, at their next refusal. A call with
// neither fair requests nor corrections leaves the clock alone; while no
// key waits (idle), the others cost one EXISTS and drop their
// corrections. fairClock applies the corrections (to tags not yet passed:
// one command each) and opens the clock lazily, at the first fair request
// while a key waits; close writes it back. Virtual time is rebased to 0, every tag and place moved
// with it, before it reaches 2^20 (as the engine's).
const fairLua = `
local function fairClock(now, argv, pos, instance)
	local clock, tags, index = KEYS[2], KEYS[3], KEYS[4]
	local places = clock .. ':w'
	local ttl, life, mine, nfix = tonumber(argv[pos]), tonumber(argv[pos + 1]), tonumber(argv[pos + 2]), tonumber(argv[pos + 4])
	local f, open, vtime, active, read, renewed = {}, false, 0, 0, 0, 0
	-- what the call read or wrote, so that each is read once a call
	local tagOf, placeOf, firsts, listedIn = {}, {}, {}, {}
	local function num(x) return string.format('%.17g', x) end
	-- idle: no key waits, anywhere (none is listed) or here; a fair
	-- request then goes by its counts alone, charged nothing, and the
	-- corrections, which order keys that wait, are dropped.
	f.idle = mine == 0 and redis.call('EXISTS', places) == 0
	if not f.idle then
		for i = pos + 5, pos + 4 + 2 * nfix, 2 do -- a tag already passed is dropped: so is its correction
			redis.call('ZADD', tags, 'XX', 'INCR', argv[i + 1], argv[i])
		end
	end
	local function tag(key)
		local t = tagOf[key]
		if t == nil then
			t = tonumber(redis.call('ZSCORE', tags, key)) or false
			tagOf[key] = t
		end
		return t or nil
	end
	local function rebase()
		local all = redis.call('ZRANGE', tags, 0, -1, 'WITHSCORES')
		for i = 1, #all, 2 do redis.call('ZADD', tags, num(tonumber(all[i + 1]) - vtime), all[i]) end
		for _, m in ipairs(redis.call('ZRANGE', index, 0, -1)) do
			local set, key = string.match(m, '^(.*)|([^|]*)$')
			if set == '' then
				local p = tonumber(redis.call('HGET', places, key))
				if p then redis.call('HSET', places, key, num(p - vtime)) end
			else
				local s = tonumber(redis.call('ZSCORE', set .. ':fq', key))
				if s then redis.call('ZADD', set .. ':fq', num(s - vtime), key) end
			end
		end
		vtime = 0
	end
	-- opened reads the clock: virtual time, when the keys' lifetimes were
	-- last renewed ("e"), and the weight waiting in each instance, this
	-- one's renewed when it is half through.
	local function opened()
		if open then return end
		open = true
		local all, me = redis.call('HGETALL', clock), 'a:' .. instance
		local seen = false
		for i = 1, #all, 2 do
			local field, value = all[i], all[i + 1]
			if field == 'v' then
				vtime = tonumber(value)
			elseif field == 'e' then
				renewed = tonumber(value)
			else
				local w, untilMs = string.match(value, '^(%S+) (%d+)$')
				w, untilMs = tonumber(w), tonumber(untilMs)
				if field == me then
					seen = mine > 0 and w == mine and untilMs > now + ttl / 2
					if mine == 0 then redis.call('HDEL', clock, me) end
				elseif untilMs <= now then
					redis.call('HDEL', clock, field)
				else
					active = active + w
				end
			end
		end
		if mine > 0 and not seen then redis.call('HSET', clock, me, num(mine) .. ' ' .. (now + ttl)) end
		active, read = active + mine, vtime
		local gone = redis.call('ZRANGEBYSCORE', index, '-inf', now, 'LIMIT', 0, 256)
		for _, m in ipairs(gone) do
			local set, key = string.match(m, '^(.*)|([^|]*)$')
			if set == '' then redis.call('HDEL', places, key) else redis.call('ZREM', set .. ':fq', key) end
		end
		if #gone > 0 then redis.call('ZREM', index, unpack(gone)) end
	end
	-- start is the virtual time at which key starts its next unit.
	function f.start(key)
		opened()
		return math.max(vtime, tag(key) or vtime)
	end
	-- listed returns key's place if it waits, else nil.
	function f.listed(key)
		local p = placeOf[key]
		if p == nil then
			p = tonumber(redis.call('HGET', places, key)) or false
			placeOf[key] = p
		end
		return p or nil
	end
	-- firstTwo returns the two keys listed first under set, and their
	-- places: {key, place, key, place}, fewer if fewer are listed.
	local function firstTwo(set)
		local two = firsts[set]
		if not two then
			two = redis.call('ZRANGE', set .. ':fq', 0, 1, 'WITHSCORES')
			for i = 2, #two, 2 do two[i] = tonumber(two[i]) end
			firsts[set] = two
		end
		return two
	end
	-- before reports whether a key other than key is listed under set
	-- at a place before place.
	function f.before(set, key, place)
		local two = firstTwo(set)
		for i = 1, #two, 2 do
			if two[i] ~= key then return two[i + 1] < place end
		end
		return false
	end
	-- list lists key as waiting under set, at its place, once a call: a
	-- listing already there is only renewed.
	function f.list(set, key)
		local id = set .. '|' .. key
		if listedIn[id] then return end
		listedIn[id], f.idle = true, false
		local place = f.listed(key)
		if not place then
			place = f.start(key)
			redis.call('HSET', places, key, num(place))
			placeOf[key] = place
		end
		if redis.call('ZADD', index, now + ttl, id, now + ttl, '|' .. key) == 0 then return end
		if redis.call('ZADD', set .. ':fq', num(place), key) == 1 then
			redis.call('PEXPIRE', set .. ':fq', life)
		end
		local two = firstTwo(set) -- keep the two first: key goes in
		local out, added = {}, false
		for i = 1, #two, 2 do
			if two[i] ~= key then
				if not added and place < two[i + 1] then out[#out + 1], out[#out + 2], added = key, place, true end
				out[#out + 1], out[#out + 2] = two[i], two[i + 1]
			end
		end
		if not added then out[#out + 1], out[#out + 2] = key, place end
		firsts[set] = {out[1], out[2], out[3], out[4]}
	end
	-- charge records a grant of work unit-seconds to key at weight w,
	-- starting at start. While no key waits, a grant is charged nothing,
	-- as the engine charges only grants from its queue: tags then are only
	-- those of keys that contend, which virtual time passes. A key listed
	-- (sets, if set: the request's, false for its key's own) moves to its
	-- new start under them if more of its requests wait, else its wait
	-- ends.
	function f.charge(key, start, w, work, sets, more)
		local tag = nil
		if active > 0 then
			if start == vtime then vtime = vtime + work / active end
			vtime = math.max(vtime, start)
			tag = start + work / w
			tagOf[key] = tag
			redis.call('ZADD', tags, num(tag), key)
		end
		if not sets then return end
		if more and tag then
			redis.call('HSET', places, key, num(tag))
			placeOf[key] = tag
			for _, set in pairs(sets) do
				if set then
					redis.call('ZADD', set .. ':fq', 'XX', num(tag), key)
					firsts[set] = nil
				end
			end
			return
		end
		local ids = {'|' .. key}
		for _, set in pairs(sets) do
			if set then
				redis.call('ZREM', set .. ':fq', key)
				ids[#ids + 1] = set .. '|' .. key
				firsts[set], listedIn[ids[#ids]] = nil, nil
			end
		end
		redis.call('ZREM', index, unpack(ids))
		redis.call('HDEL', places, key)
		placeOf[key] = false
	end
	-- close writes virtual time back if it moved, and renews the clock's
	-- lifetime every second at most.
	function f.close()
		if not open then return end
		if vtime ~= read then
			redis.call('ZREMRANGEBYSCORE', tags, '-inf', num(vtime))
			if vtime >= 1048576 then rebase() end
			redis.call('HSET', clock, 'v', num(vtime))
		end
		if now - renewed >= 1000 then
			redis.call('HSET', clock, 'e', now)
			for _, k in ipairs({clock, tags, index, places}) do redis.call('PEXPIRE', k, life) end
		end
	end
	return f
end
`
