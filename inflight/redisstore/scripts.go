package redisstore

import (
	"github.com/redis/go-redis/v9"
)

// A zone's ledger in Redis (layout a1): per set (see fleet), a hash at
// "<tag>:<set>" with a field per instance holding an allowance,
// "<units> <spare> <expiry> <version>", and a field "~r:<instance>" per
// instance reporting, "<seq> <head> <need> <target> <expiry> <notified>
// <entries>" (times in Redis's milliseconds); the reports' places come
// from the counter "<tag>:~seq"; notices go out on the channel
// "<tag>:n". The hash expires two leases after its last write, so a set
// whose fields all expired goes too.
//
// callScript applies one fleet.Call with the rules of internal/fleetref,
// which its differential test (scripts_test.go) pins it to: each line of
// the reference has its line here. Every script reads the time from
// Redis, so the instances' clocks need not agree, and touches the keys of
// one zone only (one Redis Cluster slot). It first checks its deadline
// (Redis time, µs; see clock.go): past it, it writes nothing and answers
// an error "LATE <seconds> <microseconds>".
//
// KEYS: the counter, then the sets, each once. ARGV: the deadline (µs),
// the lease and a report's life (ms), the instance, the version, the tag's
// length plus two (a notice names a set by its key less the tag and the
// colon), 1 if the call is sent again; then the number of writes and per
// write its set's index in KEYS, units and spare; the number of reports
// and per report its set's index, 1 if new, head, need, target and
// entries;
// the number of wants and per want its number of sets, 1 if it waits,
// then per set its index, cap, units, spare asked, 1 if it holds the
// set, and the allowance and spare the instance held there.
//
// The reply: Redis's TIME (seconds, microseconds), 1 if the call was
// stale (and nothing more), then per want 0 or the position of the set
// that refused it, and per set its level (its allowances less their
// spares; -1: not read) and the spare
// granted; then the number of tables and per table its set's index, its
// number of fields and the fields and values.
var callScript = redis.NewScript(`
local call, tonumber, floor = redis.call, tonumber, math.floor
local t = call('TIME')
if tonumber(t[1]) * 1000000 + tonumber(t[2]) > tonumber(ARGV[1]) then
	return redis.error_reply('LATE ' .. t[1] .. ' ' .. t[2])
end
local now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
local lease, reportLife, me, version, cut, again = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1'
local channel = string.sub(KEYS[1], 1, cut - 1) .. 'n'

-- sets[i]: KEYS[i]'s allowances and reports, once read; dirty[i]: the
-- allowances of me to write back.
local sets, dirty = {}, {}
local function load(i)
	local s = sets[i]
	if s then return s end
	s = {allow = {}, reports = {}}
	local all = call('HGETALL', KEYS[i])
	for j = 1, #all, 2 do
		local f, v = all[j], all[j + 1]
		if string.sub(f, 1, 3) == '~r:' then
			local seq, head, need, target, expiry, notified, entries = string.match(v, '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+) ?(.*)$')
			if tonumber(expiry) <= now then
				call('HDEL', KEYS[i], f)
			else
				s.reports[string.sub(f, 4)] = {seq = tonumber(seq), head = tonumber(head), need = tonumber(need), target = target,
					expiry = tonumber(expiry), notified = tonumber(notified), entries = entries}
			end
		else
			local units, spare, expiry, v2 = string.match(v, '^(%S+) (%S+) (%S+) (%S+)$')
			if tonumber(expiry) <= now then
				call('HDEL', KEYS[i], f)
			else
				s.allow[f] = {units = tonumber(units), spare = tonumber(spare), expiry = tonumber(expiry), version = tonumber(v2)}
			end
		end
	end
	sets[i] = s
	return s
end
local function units(s, inst)
	local a = s.allow[inst]
	return a and a.units or 0
end
local function level(s)
	local n = 0
	for _, a in pairs(s.allow) do n = n + a.units end
	return n
end
local function spares(s)
	local n = 0
	for _, a in pairs(s.allow) do n = n + a.spare end
	return n
end
local function othersReport(s)
	for inst in pairs(s.reports) do
		if inst ~= me then return true end
	end
	return false
end
local function held(s, inst)
	local r = s.reports[inst]
	if r == nil or floor(tonumber(r.target)) - units(s, inst) < r.need then return 0 end
	return r.need
end
local function holds(s, want)
	local mine = s.reports[me]
	local all = mine == nil or units(s, me) + want > floor(tonumber(mine.target))
	local n = 0
	for inst, r in pairs(s.reports) do
		if inst ~= me and (all or r.seq < mine.seq) then n = n + held(s, inst) end
	end
	return n
end

-- The version: a call older than a write of me in a set it touches is
-- stale. The sets are read in the order the call names them.
local pos = 8
local writes = tonumber(ARGV[pos])
local wpos = pos + 1
pos = wpos + 3 * writes
local reports = tonumber(ARGV[pos])
local rpos = pos + 1
pos = rpos + 6 * reports
local wants = tonumber(ARGV[pos])
local qpos = pos + 1
local touched = {}
for j = 0, writes - 1 do touched[#touched + 1] = tonumber(ARGV[wpos + 3 * j]) end
for j = 0, reports - 1 do touched[#touched + 1] = tonumber(ARGV[rpos + 6 * j]) end
pos = qpos
for j = 1, wants do
	local n = tonumber(ARGV[pos])
	for k = 0, n - 1 do touched[#touched + 1] = tonumber(ARGV[pos + 2 + 7 * k]) end
	pos = pos + 2 + 7 * n
end
for _, i in ipairs(touched) do
	local a = load(i).allow[me]
	if a and a.version > version then return {tonumber(t[1]), tonumber(t[2]), 1} end
end

local function put(i, u, sp)
	if u == 0 and sp == 0 then
		sets[i].allow[me] = nil
	else
		sets[i].allow[me] = {units = u, spare = sp, expiry = now + lease, version = version}
	end
	dirty[i] = true
end
if again then
	pos = qpos
	for j = 1, wants do
		local n = tonumber(ARGV[pos])
		for k = 0, n - 1 do
			local p = pos + 2 + 7 * k
			put(tonumber(ARGV[p]), tonumber(ARGV[p + 5]), tonumber(ARGV[p + 6]))
		end
		pos = pos + 2 + 7 * n
	end
end

local notices = {}
for j = 0, writes - 1 do
	local i, u, sp = tonumber(ARGV[wpos + 3 * j]), tonumber(ARGV[wpos + 3 * j + 1]), tonumber(ARGV[wpos + 3 * j + 2])
	local s = sets[i]
	local old = units(s, me)
	put(i, u, sp)
	if u < old and othersReport(s) then notices[#notices + 1] = 'f ' .. string.sub(KEYS[i], cut) end
end

local tables, listed = {}, {}
local function table1(i)
	if not listed[i] then
		listed[i] = true
		tables[#tables + 1] = i
	end
end
for j = 0, reports - 1 do
	local p = rpos + 6 * j
	local i, new, head, need, target, entries = tonumber(ARGV[p]), ARGV[p + 1] == '1', tonumber(ARGV[p + 2]), tonumber(ARGV[p + 3]), ARGV[p + 4], ARGV[p + 5]
	local s = sets[i]
	local old, was = s.reports[me], held(s, me)
	if head <= 0 then
		s.reports[me] = nil
		call('HDEL', KEYS[i], '~r:' .. me)
		if was > 0 and othersReport(s) then notices[#notices + 1] = 'f ' .. string.sub(KEYS[i], cut) end
	else
		local notified = old and old.notified or 0
		if old == nil or now - notified >= floor(reportLife / 2) then
			notices[#notices + 1] = 'w ' .. string.sub(KEYS[i], cut)
			notified = now
		end
		local seq
		if old and not new then seq = old.seq else seq = call('INCR', KEYS[1]) end
		s.reports[me] = {seq = seq, head = head, need = need, target = target, expiry = now + reportLife, notified = notified, entries = entries}
		call('HSET', KEYS[i], '~r:' .. me, seq .. ' ' .. head .. ' ' .. need .. ' ' .. target .. ' ' .. (now + reportLife) .. ' ' .. notified .. ' ' .. entries)
		call('PEXPIRE', KEYS[i], 2 * lease)
		if held(s, me) < was and othersReport(s) then notices[#notices + 1] = 'f ' .. string.sub(KEYS[i], cut) end
		table1(i)
	end
end

local out = {tonumber(t[1]), tonumber(t[2]), 0}
local reserved = {}
pos = qpos
for j = 1, wants do
	local n, waits = tonumber(ARGV[pos]), ARGV[pos + 1] == '1'
	local first = pos + 2
	pos = first + 7 * n
	local levels, refused = {}, 0
	for k = 0, n - 1 do
		local p = first + 7 * k
		local i, cap, u = tonumber(ARGV[p]), tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2])
		local s = sets[i]
		local l = level(s)
		levels[k + 1] = l - spares(s)
		if reserved[i] or l + u + holds(s, u) > cap then
			refused = k + 1
			for m = k + 2, n do levels[m] = -1 end
			break
		end
	end
	out[#out + 1] = refused
	local granted = {}
	if refused == 0 then
		for k = 0, n - 1 do
			local p = first + 7 * k
			local i, cap, u, ask = tonumber(ARGV[p]), tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2]), tonumber(ARGV[p + 3])
			local s = sets[i]
			local was = held(s, me)
			local a = s.allow[me]
			if a == nil then
				a = {units = 0, spare = 0}
				s.allow[me] = a
			end
			a.units = a.units + u
			a.expiry, a.version = now + lease, version
			local g = 0
			if ask > 0 and not othersReport(s) then
				local reserve = floor(cap / 10)
				g = math.max(0, math.min(ask, reserve - spares(s), cap - reserve - level(s)))
				a.units = a.units + g
				a.spare = a.spare + g
			end
			granted[k + 1] = g
			levels[k + 1] = level(s) - spares(s)
			dirty[i] = true
			if held(s, me) < was and othersReport(s) then notices[#notices + 1] = 'f ' .. string.sub(KEYS[i], cut) end
		end
	elseif waits then
		local i = tonumber(ARGV[first + 7 * (refused - 1)])
		reserved[i] = true
		for k = 0, n - 1 do
			if ARGV[first + 7 * k + 4] == '1' then reserved[tonumber(ARGV[first + 7 * k])] = true end
		end
		table1(i)
	end
	for k = 1, n do
		out[#out + 1] = levels[k]
		out[#out + 1] = granted[k] or 0
	end
end

-- What a call writes expires at now + lease, at this version. A set left
-- with no field goes with the others of the call in one DEL: a key used
-- once costs a call less.
local tail, ttl, gone = ' ' .. (now + lease) .. ' ' .. ARGV[5], tostring(2 * lease), {}
for i in pairs(dirty) do
	local s = sets[i]
	local a = s.allow[me]
	if a then
		call('HSET', KEYS[i], me, a.units .. ' ' .. a.spare .. tail)
		call('PEXPIRE', KEYS[i], ttl)
	elseif next(s.allow) == nil and next(s.reports) == nil then
		gone[#gone + 1] = KEYS[i]
		if #gone == 512 then -- unpack is bounded by Lua's stack
			call('DEL', unpack(gone))
			gone = {}
		end
	else
		call('HDEL', KEYS[i], me)
	end
end
if #gone > 0 then call('DEL', unpack(gone)) end
for _, n in ipairs(notices) do call('PUBLISH', channel, n) end

out[#out + 1] = #tables
for _, i in ipairs(tables) do
	local s = sets[i]
	local fields = {}
	for inst, a in pairs(s.allow) do
		fields[#fields + 1] = inst
		fields[#fields + 1] = a.units .. ' ' .. a.spare .. ' ' .. a.expiry .. ' ' .. a.version
	end
	for inst, r in pairs(s.reports) do
		fields[#fields + 1] = '~r:' .. inst
		fields[#fields + 1] = r.seq .. ' ' .. r.head .. ' ' .. r.need .. ' ' .. r.target .. ' ' .. r.expiry .. ' ' .. r.notified .. ' ' .. r.entries
	end
	out[#out + 1] = i
	out[#out + 1] = #fields / 2
	for _, f in ipairs(fields) do out[#out + 1] = f end
end
return out
`)

// timeScript reads Redis's TIME on the server of the key it is given: in a
// cluster, the zone's slot.
var timeScript = redis.NewScript(`
local t = redis.call('TIME')
return {tonumber(t[1]), tonumber(t[2])}
`)
