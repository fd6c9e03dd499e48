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

// admitScript first removes this instance's leases that ended and are not
// removed yet (announcing it if anyone waits), then admits, in order, each
// of a batch of requests whose every sorted set has room, all of its sets
// or none. It answers, after the time, per request the 1-based position
// among its sets of the one that was full, or 0 when it was admitted
// (decoded into verdicts by decodeVerdicts). If a request that will wait was refused, the instance
// is listed in the waiting set, so that releases anywhere announce
// themselves.
//
// KEYS[1]: the zone's waiting set; the rest: the sorted sets. ARGV: the
// deadline (µs), the lease (ms), how long a waiting listing lasts (ms), the instance, the
// channel, the number of leases to remove, then per lease to remove its
// set's index in KEYS and its member; then the number of requests, then
// per request its member, 1 if it waits when refused, its number of sets,
// and per set its index in KEYS and its max.
var admitScript = redis.NewScript(`
local t = redis.call('TIME')
if tonumber(t[1]) * 1000000 + tonumber(t[2]) > tonumber(ARGV[1]) then
	return redis.error_reply('LATE ' .. t[1] .. ' ' .. t[2])
end
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease, listing, instance, channel = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
local expiry, ttl = now + lease, 2 * lease
local pos, removed = 7, 0
for i = 1, tonumber(ARGV[6]) do
	removed = removed + redis.call('ZREM', KEYS[tonumber(ARGV[pos])], ARGV[pos + 1])
	pos = pos + 2
end
if removed > 0 then
	redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
	if redis.call('ZCARD', KEYS[1]) > 0 then redis.call('PUBLISH', channel, '1') end
end
local n = tonumber(ARGV[pos])
pos = pos + 1
local cleaned, out, waits = {}, {tonumber(t[1]), tonumber(t[2])}, false
for r = 1, n do
	local member, willWait, count = ARGV[pos], ARGV[pos + 1] == '1', tonumber(ARGV[pos + 2])
	pos = pos + 3
	local sets, full = {}, 0
	for j = 1, count do
		local key, max = KEYS[tonumber(ARGV[pos])], tonumber(ARGV[pos + 1])
		pos = pos + 2
		sets[j] = key
		if full == 0 then
			if not cleaned[key] then
				redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
				cleaned[key] = true
			end
			if redis.call('ZCARD', key) >= max then full = j end
		end
	end
	if full == 0 then
		for _, key in ipairs(sets) do
			redis.call('ZADD', key, expiry, member)
			redis.call('PEXPIRE', key, ttl)
		end
	elseif willWait then
		waits = true
	end
	out[r + 2] = full
end
if waits then
	redis.call('ZADD', KEYS[1], now + listing, instance)
	redis.call('PEXPIRE', KEYS[1], listing)
end
return out
`)

// verdict is how the admission of one request of a batch ended: Admitted,
// Full (by the script) or KeysFull (by max_keys, before the script).
type verdict struct {
	outcome limiter.Outcome
	dim     int // the refusing dimension (limiter.TotalDim: the total)
}

// decodeVerdicts turns the admission script's reply into verdicts; dims
// gives, per request, the dimension of each of its sets.
func decodeVerdicts(reply []int64, dims [][]int) []verdict {
	out := make([]verdict, len(reply))
	for i, full := range reply {
		if full == 0 {
			out[i] = verdict{outcome: limiter.Admitted}
			continue
		}
		out[i] = verdict{outcome: limiter.Full, dim: dims[i][full-1]}
	}
	return out
}

// releaseScript removes leases from their sets and, if any instance has
// waiters in the zone, announces that slots freed. It answers how many
// members it removed.
//
// KEYS[1]: the zone's waiting set; the rest: sets, one per member. ARGV:
// the channel, then the member in each set.
var releaseScript = redis.NewScript(`
local removed = 0
for i = 2, #KEYS do removed = removed + redis.call('ZREM', KEYS[i], ARGV[i]) end
local t = redis.call('TIME')
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
if removed > 0 and redis.call('ZCARD', KEYS[1]) > 0 then redis.call('PUBLISH', ARGV[1], '1') end
return removed
`)

// renewScript writes leases with a new expiry, re-creating those Redis
// lost. It answers, after the time, how many it re-created.
//
// KEYS: sets, one per member. ARGV: the deadline (µs), the lease (ms), then
// the member in each set.
var renewScript = redis.NewScript(`
local t = redis.call('TIME')
if tonumber(t[1]) * 1000000 + tonumber(t[2]) > tonumber(ARGV[1]) then
	return redis.error_reply('LATE ' .. t[1] .. ' ' .. t[2])
end
local lease = tonumber(ARGV[2])
local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + lease
local created = 0
for i, key in ipairs(KEYS) do
	created = created + redis.call('ZADD', key, expiry, ARGV[i + 2])
	redis.call('PEXPIRE', key, 2 * lease)
end
return {tonumber(t[1]), tonumber(t[2]), created}
`)

// entries are (set, member) pairs of one zone, in the shape the release
// and renewal scripts take them.
type entries struct {
	keys    []string
	members []any
}

func (e *entries) add(set, member string) {
	e.keys = append(e.keys, set)
	e.members = append(e.members, member)
}
