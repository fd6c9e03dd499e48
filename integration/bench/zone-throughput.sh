#!/usr/bin/env bash
# Admissions/s through one zone, in process and with `store redis`, and the
# Redis CPU each admission costs (INFO commandstats):
#
#   ./zone-throughput.sh [caddy-binary]   (default: builds examples/caddy)
#
# One Caddy, a `respond` route behind `inflight 1000000` (one key: wrk's
# address; then with `fair client` too), then behind a limit on a header
# that wrk sets to one of 64, then 1,000 keys, request by request
# (keys.lua: each wrk thread its own part of them; the only limit), a
# loopback redis-server on a port of its own, and wrk -c16 (and -c1 for
# the latency of one connection; DURATION, default 5s). Everything listens on 127.0.0.1 and is stopped on
# exit. KEY_COUNTS="64 1000" sets the numbers of keys, KEYED_ONLY=1 runs
# only those runs; each run with Redis prints the memory Redis holds
# after it (every lease still alive). Other work on the machine skews the figures: compare runs made
# back to back. INSTANCES=3 runs three Caddys at once instead of one,
# sharing the zone through Redis (in process, each has its own), each
# under a wrk of its own with a third of the connections. With PIN=1, Caddy and wrk run on CPU 0 and Redis on CPU 1
# (taskset), in every run: Redis no longer takes Caddy's CPU, as when it
# runs on a host of its own.
set -euo pipefail
cd "$(dirname "$0")"
. ./cleanup.sh
duration=${DURATION:-5s}
redis_port=${REDIS_PORT:-16399}
http_port=${HTTP_PORT:-18399}

on_caddy=() on_redis=()
if [[ ${PIN:-} == 1 ]]; then
	on_caddy=(taskset -c 0) on_redis=(taskset -c 1)
fi

caddy=${1:-}
if [[ -z $caddy ]]; then
	(cd "$root" && go build -o "$tmp/caddy" ./examples/caddy)
	caddy=$tmp/caddy
fi

"${on_redis[@]}" redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
pids+=($!)
until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.1; done

# redis_cpu prints the CPU seconds redis-server has used.
redis_cpu() {
	redis-cli -p "$redis_port" info cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ { s += $2 } END { print s }'
}

# redis_memory prints the memory Redis uses and its peak (INFO memory).
redis_memory() {
	redis-cli -p "$redis_port" info memory | tr -d '\r' | awk -F: '$1 == "used_memory_human" { u = $2 } $1 == "used_memory_peak_human" { p = $2 } END { print u " (peak " p ")" }'
}

# run NAME STORE [LIMIT [WRK-SCRIPT]]: INSTANCES Caddys (default one)
# with STORE (empty: in process), each under a wrk of its own, all at
# once, CONNS connections in all (default 16); prints their requests/s
# summed, and with a store the Redis figures. Caddys with one store share
# the zone: its limits count across them.
run() {
	local name=$1 store=$2 limit=${3:-} script=() head="inflight 1000000"
	local n=${INSTANCES:-1} conns=${CONNS:-16} i
	[[ -n $limit ]] && head="inflight"
	[[ -n ${4:-} ]] && script=(-s "$4")
	redis-cli -p "$redis_port" flushall >/dev/null
	local caddies=()
	for ((i = 0; i < n; i++)); do
		cat >"$tmp/Caddyfile$i" <<CADDY
{
	admin off
	auto_https off
	log {
		level ERROR
	}
}
http://127.0.0.1:$((http_port + i)) {
	$head {
		$limit
		$store
	}
	respond "ok"
}
CADDY
		"${on_caddy[@]}" "$caddy" run --config "$tmp/Caddyfile$i" --adapter caddyfile >"$tmp/$name$i.log" 2>&1 &
		caddies+=($!)
		pids+=($!)
	done
	for ((i = 0; i < n; i++)); do
		until curl -fs "http://127.0.0.1:$((http_port + i))/" >/dev/null; do sleep 0.1; done
		WARMUP=1 "${on_caddy[@]}" wrk -t2 -c16 -d1s "${script[@]}" "http://127.0.0.1:$((http_port + i))/" >/dev/null # warm-up
	done
	redis-cli -p "$redis_port" config resetstat >/dev/null
	local rps=0 requests=0 p50 p90 cpu0 cpu1 each=$((conns / n)) threads=2 wrks=()
	((each < 2)) && threads=1
	cpu0=$(redis_cpu)
	for ((i = 0; i < n; i++)); do
		THREADS=$threads "${on_caddy[@]}" wrk -t$threads -c"$each" -d"$duration" --latency "${script[@]}" "http://127.0.0.1:$((http_port + i))/" >"$tmp/wrk$i" &
		wrks+=($!)
	done
	wait "${wrks[@]}"
	cpu1=$(redis_cpu)
	for ((i = 0; i < n; i++)); do
		rps=$(awk -v s="$rps" '/^Requests\/sec/ {print s + $2}' "$tmp/wrk$i")
		requests=$(awk -v s="$requests" '/requests in/ {print s + $1}' "$tmp/wrk$i")
	done
	p50=$(awk '$1 == "50%" {print $2}' "$tmp/wrk0")
	p90=$(awk '$1 == "90%" {print $2}' "$tmp/wrk0")
	echo "$name: $rps requests/s ($requests requests in $duration, $n Caddy, $conns connections; p50 $p50, p90 $p90)"
	if [[ -n $store ]]; then
		redis-cli -p "$redis_port" info commandstats | tr -d '\r' | awk -F'[:=,]' -v n="$requests" '
			/^cmdstat_(evalsha|eval|zrem|zadd|incrby|decrby|get|zrangebyscore|zremrangebyscore|pexpire)(_ro)?:/ {
				printf "  %-26s calls %9d  %.2f per request  %6.2f usec/call\n", $1, $3, $3 / n, $7
			}
			/^cmdstat_(evalsha|eval):/ { usec += $5; scripts += $3 }
			END { printf "  scripts %.3f per request, %.2f usec per request in scripts (commandstats)\n", scripts / n, usec / n }'
		awk -v a="$cpu0" -v b="$cpu1" -v n="$requests" 'BEGIN { printf "  redis-server CPU (user+sys, INFO cpu) %.2f usec per request\n", (b - a) * 1e6 / n }'
		echo "  redis memory: $(redis_memory) after the run, $(redis-cli -p "$redis_port" dbsize) keys"
	fi
	kill "${caddies[@]}"
	wait "${caddies[@]}" 2>/dev/null || true
}

if [[ -z ${KEYED_ONLY:-} ]]; then
	run in-process ""
	run redis "store redis {
				address 127.0.0.1:$redis_port
			}"
	# fair, on the zone's fair clock in Redis (no key waits: wrk's one key).
	run redis-fair "wait 5s
			fair client
			store redis {
				address 127.0.0.1:$redis_port
			}"
	# One connection: the latency a request pays, p50 and p90.
	CONNS=1 INSTANCES=1 run in-process-1conn ""
	CONNS=1 INSTANCES=1 run redis-1conn "store redis {
				address 127.0.0.1:$redis_port
			}"
fi
# 64 and 1,000 keys (KEY_COUNTS), the only limit.
keyed="limit key {header.X-Key} 1000000"
for keys in ${KEY_COUNTS:-64 1000}; do
	export KEYS=$keys
	run in-process-keys$keys "" "$keyed" keys.lua
	run redis-keys$keys "store redis {
			address 127.0.0.1:$redis_port
		}" "$keyed" keys.lua
done
