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
// KEYS: the counter, then the sets, each once. ARGV[1]: one msgpack
// array (scriptArgs), A: the deadline (µs), the lease and a report's life
// (ms), the instance, the version, the tag's length plus two (a notice
// names a set by its key less the tag and the colon), 1 if the call is
// sent again; then the number of writes and per write its set's index in
// KEYS, units and spare; the number of reports and per report its set's
// index, 1 if new, head, need, target (a string) and entries; the number
// of wants and per want its number of sets, 1 if it waits, then per set
// its index, cap, units, spare asked, 1 if it holds the set, and the
// allowance and spare the instance held there.
//
// The reply: Redis's TIME (seconds, microseconds), 1 if the call was
// stale (and nothing more), then per want 0 or the position of the set
// that refused it, and per set its level (its allowances less their
// spares; -1: not read) and the spare
// granted; then the number of tables and per table its set's index, its
// number of fields and the fields and values.
var callScript = redis.NewScript(`
local call, tonumber, floor, byte, match, sub = redis.call, tonumber, math.floor, string.byte, string.match, string.sub
local A = cmsgpack.unpack(ARGV[1])
local t = call('TIME')
if tonumber(t[1]) * 1000000 + tonumber(t[2]) > A[1] then
	return redis.error_reply('LATE ' .. t[1] .. ' ' .. t[2])
end
local now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
local lease, reportLife, me, version, cut, again = A[2], A[3], A[4], A[5], A[6], A[7] == 1
local channel = sub(KEYS[1], 1, cut - 1) .. 'n'

-- sets[i]: KEYS[i]'s allowances and reports, once read; dirty[i]: the
-- allowances of me to write back. A set with no report shares none (a
-- key used once costs a table less), which nothing writes to.
local sets, dirty, none = {}, {}, {}
local function load(i)
	local s = sets[i]
	if s then return s end
	local allow, reports = {}, none
	local all = call('HGETALL', KEYS[i])
	for j = 1, #all, 2 do
		local f, v = all[j], all[j + 1]
		if byte(f) == 126 then -- '~r:<instance>'
			local seq, head, need, target, expiry, notified, entries = match(v, '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+) ?(.*)$')
			if tonumber(expiry) <= now then
				call('HDEL', KEYS[i], f)
			else
				if reports == none then reports = {} end
				reports[sub(f, 4)] = {seq = tonumber(seq), head = tonumber(head), need = tonumber(need), target = target,
					expiry = tonumber(expiry), notified = tonumber(notified), entries = entries}
			end
		else
			local units, spare, expiry, v2 = match(v, '^(%S+) (%S+) (%S+) (%S+)$')
			expiry = tonumber(expiry)
			if expiry <= now then
				call('HDEL', KEYS[i], f)
			else
				allow[f] = {units = tonumber(units), spare = tonumber(spare), expiry = expiry, version = tonumber(v2)}
			end
		end
	end
	s = {allow = allow, reports = reports}
	sets[i] = s
	return s
end
local function units(s, inst)
	local a = s.allow[inst]
	return a and a.units or 0
end
-- tally: the set's level (its allowances) and its spares.
local function tally(s)
	local n, sp = 0, 0
	for _, a in pairs(s.allow) do n, sp = n + a.units, sp + a.spare end
	return n, sp
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

-- Where the call's parts start in A: its writes (per write its set,
-- units and spare), its reports (6 each) and its wants (per want its
-- number of sets and 1 if it waits, then 7 per set).
local writes = A[8]
local wpos = 9
local reports = A[wpos + 3 * writes]
local rpos = wpos + 3 * writes + 1
local wants = A[rpos + 6 * reports]
local qpos = rpos + 6 * reports + 1

-- The version: a call older than a write of me in a set it touches is
-- stale. The sets are read in the order the call names them.
local function stale(i)
	local a = load(i).allow[me]
	return a ~= nil and a.version > version
end
for p = wpos, rpos - 2, 3 do
	if stale(A[p]) then return {tonumber(t[1]), tonumber(t[2]), 1} end
end
for p = rpos, qpos - 2, 6 do
	if stale(A[p]) then return {tonumber(t[1]), tonumber(t[2]), 1} end
end
local pos = qpos
for j = 1, wants do
	local n = A[pos]
	for p = pos + 2, pos + 7 * n, 7 do
		if stale(A[p]) then return {tonumber(t[1]), tonumber(t[2]), 1} end
	end
	pos = pos + 2 + 7 * n
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
		local n = A[pos]
		for p = pos + 2, pos + 7 * n, 7 do put(A[p], A[p + 5], A[p + 6]) end
		pos = pos + 2 + 7 * n
	end
end

local notices = {}
for p = wpos, rpos - 2, 3 do
	local i, u, sp = A[p], A[p + 1], A[p + 2]
	local s = sets[i]
	local old = units(s, me)
	put(i, u, sp)
	if u < old and othersReport(s) then notices[#notices + 1] = 'f ' .. sub(KEYS[i], cut) end
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
	local i, new, head, need, target, entries = A[p], A[p + 1] == 1, A[p + 2], A[p + 3], A[p + 4], A[p + 5]
	local s = sets[i]
	local old, was = s.reports[me], held(s, me)
	if head <= 0 then
		if old then s.reports[me] = nil end
		call('HDEL', KEYS[i], '~r:' .. me)
		if was > 0 and othersReport(s) then notices[#notices + 1] = 'f ' .. sub(KEYS[i], cut) end
	else
		local notified = old and old.notified or 0
		if old == nil or now - notified >= floor(reportLife / 2) then
			notices[#notices + 1] = 'w ' .. sub(KEYS[i], cut)
			notified = now
		end
		local seq
		if old and not new then seq = old.seq else seq = call('INCR', KEYS[1]) end
		if s.reports == none then s.reports = {} end
		s.reports[me] = {seq = seq, head = head, need = need, target = target, expiry = now + reportLife, notified = notified, entries = entries}
		call('HSET', KEYS[i], '~r:' .. me, seq .. ' ' .. head .. ' ' .. need .. ' ' .. target .. ' ' .. (now + reportLife) .. ' ' .. notified .. ' ' .. entries)
		call('PEXPIRE', KEYS[i], 2 * lease)
		if held(s, me) < was and othersReport(s) then notices[#notices + 1] = 'f ' .. sub(KEYS[i], cut) end
		table1(i)
	end
end

-- Per want, out gets its verdict at o, then per set its level and the
-- spare granted.
local out = {tonumber(t[1]), tonumber(t[2]), 0}
local reserved = {}
pos = qpos
for j = 1, wants do
	local n = A[pos]
	local first, o = pos + 2, #out + 1
	pos = first + 7 * n
	out[o] = 0
	local refused = 0
	for k = 1, n do
		local p = first + 7 * (k - 1)
		local i, cap, u = A[p], A[p + 1], A[p + 2]
		local s = sets[i]
		local l, sp = tally(s)
		out[o + 2 * k - 1], out[o + 2 * k] = l - sp, 0
		if reserved[i] or l + u + holds(s, u) > cap then
			refused = k
			for r = k + 1, n do out[o + 2 * r - 1], out[o + 2 * r] = -1, 0 end
			break
		end
	end
	out[o] = refused
	if refused == 0 then
		for k = 1, n do
			local p = first + 7 * (k - 1)
			local i, cap, u, ask = A[p], A[p + 1], A[p + 2], A[p + 3]
			local s = sets[i]
			local was, l, sp = held(s, me), tally(s)
			l = l + u
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
				g = math.max(0, math.min(ask, reserve - sp, cap - reserve - l))
				a.units = a.units + g
				a.spare = a.spare + g
			end
			out[o + 2 * k - 1], out[o + 2 * k] = l - sp, g
			dirty[i] = true
			if held(s, me) < was and othersReport(s) then notices[#notices + 1] = 'f ' .. sub(KEYS[i], cut) end
		end
	elseif A[first - 1] == 1 then
		local i = A[first + 7 * (refused - 1)]
		reserved[i] = true
		for p = first, pos - 7, 7 do
			if A[p + 4] == 1 then reserved[A[p]] = true end
		end
		table1(i)
	end
end

-- What a call writes expires at now + lease, at this version. A set left
-- with no field goes with the others of the call in one DEL: a key used
-- once costs a call less.
local tail, ttl, gone = ' ' .. (now + lease) .. ' ' .. A[5], tostring(2 * lease), {}
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
