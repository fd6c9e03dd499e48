#!/usr/bin/env bash
# Prints the performance figures of caddy-inflight as markdown tables, with
# ratios:
#
#   ./run.sh           full run: about 6 minutes on 2 cores
#   QUICK=1 ./run.sh   every step builds and runs once, briefly: for CI, the
#                      figures mean nothing
#
# Steps: Go benchmarks (engine, handler, Caddy route, peers) through
# benchstat; a built Caddy with and without `inflight` under wrk (loadgen if
# wrk is not installed, or E2E_TOOL=loadgen), alternated; exactness at a
# backend under 20x overload. What this script and its Go programs start
# listens on and loads 127.0.0.1 only, and is stopped on exit. Run it on an
# otherwise idle machine: other work skews every figure, and other tests of
# the integration package share BenchmarkCaddyRoute's admin port.
set -euo pipefail
cd "$(dirname "$0")"
. ./cleanup.sh

if [[ -n ${QUICK:-} ]]; then
	run_mode="QUICK (the figures mean nothing)" count=1 benchtime=100x e2e_secs=1 warmup_secs=1 overload=2s tenants_secs=1
else
	run_mode=full count=6 benchtime=1s e2e_secs=10 warmup_secs=2 overload=10s tenants_secs=10
fi
rounds=3 conns=64
started=$(date -u '+%Y-%m-%d %H:%M UTC')
# Other work on the machine skews every figure; the table shows this.
load_at_start=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo unknown)
tool=${E2E_TOOL:-$(command -v wrk >/dev/null && echo wrk || echo loadgen)}

say() { echo "== $*" >&2; }

benchstat=$(command -v benchstat || true)
if [[ -z $benchstat ]]; then
	say "installing benchstat"
	go install golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da # pinned
	gobin=$(go env GOBIN)
	benchstat=${gobin:-$(go env GOPATH)/bin}/benchstat
fi

say "building Caddy with the module, and loadgen"
(cd "$root" && go build -o "$tmp/caddy" ./examples/caddy)
go build -o "$tmp/loadgen" ./loadgen

# gobench DIR NAME ARGS...: one run of go test benchmarks in DIR, appended
# to $tmp/NAME.txt, shown only if it fails. Stderr goes apart: a log line
# written while a benchmark runs would split its result line.
gobench() {
	local dir=$1 out=$tmp/$2.txt
	shift 2
	if ! (cd "$dir" && go test -run '^$' -benchmem -count 1 -benchtime "$benchtime" "$@") >>"$out" 2>>"$out.stderr"; then
		cat "$out" "$out.stderr" >&2
		exit 1
	fi
}
# $count rounds of one run of every benchmark each, rather than -count: the
# variants compared are interleaved, so a drift in the machine's speed falls
# on all of them alike. The Caddy route variants run one per process, in
# rotating order, so that none is always the first in its process.
say "benchmarks: engine, handler, Caddy route and peers; rounds: $count"
route_variants=(without pass_through with_inflight with_adaptive)
for round in $(seq "$count"); do
	gobench "$root" engine -bench '^(BenchmarkAdmitRelease|BenchmarkRefuse|BenchmarkBesideWaiters|BenchmarkAdaptiveObserve)$' ./inflight/limiter
	gobench "$root" engine -bench '^BenchmarkParallelKeys$' -cpu 1,2 ./inflight/limiter
	gobench "$root" handler -bench '^(BenchmarkAdmitRelease|BenchmarkRefuse)' ./inflight
	for i in "${!route_variants[@]}"; do
		variant=${route_variants[(round + i) % ${#route_variants[@]}]}
		gobench "$root" route -bench "^BenchmarkCaddyRoute\$/^$variant\$" ./integration
	done
	gobench . peers -bench '^BenchmarkPeers$' .
done

for f in engine handler route; do
	"$benchstat" "$tmp/$f.txt"
done
"$benchstat" -col /impl "$tmp/peers.txt"

# median_of: the median of the numbers on stdin, one a line, as benchstat
# takes it; nan if there are none.
median_of() {
	sort -g | awk '{ v[n++] = $1 } END { print n == 0 ? "nan" : n % 2 ? v[int(n / 2)] : (v[n / 2 - 1] + v[n / 2]) / 2 }'
}

# median FILE NAME UNIT [PROCS]: the median of UNIT over the runs of
# BenchmarkNAME in $tmp/FILE.txt; with PROCS, only the runs at that
# GOMAXPROCS.
median() {
	awk -v name="$2" -v unit="$3" -v procs="${4:-}" '
		BEGIN {
			suffix = procs == "" ? "(-[0-9]+)?" : procs == 1 ? "" : "-" procs
			re = "^Benchmark" name suffix "$"
		}
		$1 ~ re { for (i = 4; i <= NF; i += 2) if ($i == unit) print $(i - 1) }' "$tmp/$1.txt" | median_of
}

# middle NUMBERS...: their median.
middle() { printf '%s\n' "$@" | median_of; }

# calc FORMAT EXPR: EXPR evaluated with awk's floats, printed with FORMAT;
# n/a if it uses a median that has no runs.
calc() {
	if [[ $2 == *nan* ]]; then
		echo n/a
		return
	fi
	LC_ALL=C awk -v format="$1" "BEGIN { printf format, $2 }"
}

# field JSON NAME: the number NAME holds in a one-line JSON object.
field() { sed -n "s/.*\"$2\":\([-0-9.eE+]*\).*/\1/p" <<<"$1"; }

# free_port: a loopback port nothing listens on now.
free_port() {
	local port
	while :; do
		port=$((20000 + RANDOM % 40000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			echo "$port"
			return
		fi
	done
}

# wait_listen PORT: wait (up to 30 s) until something listens on PORT.
wait_listen() {
	for _ in $(seq 300); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
			return 0
		fi
		sleep 0.1
	done
	return 1
}

# load URL SECONDS: one line of JSON: requests, errors, seconds, rps, p50_ms,
# p99_ms.
load() {
	if [[ $tool == wrk ]]; then
		# One thread: on a small machine the other cores are Caddy's.
		wrk -t1 -c"$conns" -d"$2s" --latency -s wrk.lua "$1" | tail -n 1
	else
		"$tmp/loadgen" -url "$1" -c "$conns" -d "$2s"
	fi
}

say "end to end: Caddy with and without inflight, $tool, $rounds rounds of ${e2e_secs}s each"
port_with=$(free_port)
port_without=$(free_port)
while [[ $port_without == "$port_with" ]]; do port_without=$(free_port); done
cat >"$tmp/e2e.Caddyfile" <<EOF
{
	admin off
	auto_https off
	persist_config off
}
http://127.0.0.1:$port_with {
	bind 127.0.0.1
	inflight 100000
	respond "ok"
}
http://127.0.0.1:$port_without {
	bind 127.0.0.1
	respond "ok"
}
EOF
# Caddy's storage and config directories go to the temp dir.
HOME=$tmp XDG_DATA_HOME=$tmp XDG_CONFIG_HOME=$tmp \
	"$tmp/caddy" run --config "$tmp/e2e.Caddyfile" --adapter caddyfile >"$tmp/caddy.log" 2>&1 &
pids+=($!)
if ! wait_listen "$port_with" || ! wait_listen "$port_without"; then
	cat "$tmp/caddy.log" >&2
	exit 1
fi
url_with=http://127.0.0.1:$port_with/
url_without=http://127.0.0.1:$port_without/
for url in "$url_with" "$url_without"; do
	probe=$("$tmp/loadgen" -url "$url" -c 1 -n 1 -d 5s)
	if [[ $probe != *'"status":{"200":1}'* ]]; then
		echo "probe of $url: $probe" >&2
		exit 1
	fi
	load "$url" "$warmup_secs" >/dev/null
done

# measure with|without: one measured run of that side, appended to rps_SIDE
# and p99_SIDE; its failed requests are added to e2e_errors.
measure() {
	local url=$url_without out rps p99
	[[ $1 == with ]] && url=$url_with
	out=$(load "$url" "$e2e_secs")
	echo "   $1: $out" >&2
	e2e_errors=$((e2e_errors + $(field "$out" errors)))
	rps=$(field "$out" rps) p99=$(field "$out" p99_ms)
	if [[ $1 == with ]]; then
		rps_with+=("$rps") p99_with+=("$p99")
	else
		rps_without+=("$rps") p99_without+=("$p99")
	fi
}
e2e_errors=0
rps_with=() rps_without=() p99_with=() p99_without=() rps_ratio=() p99_ratio=()
for round in $(seq "$rounds"); do
	# ABBA order, so a drift over the run favours neither side.
	if ((round % 2)); then
		measure without
		measure with
	else
		measure with
		measure without
	fi
	i=$((round - 1))
	rps_ratio+=("$(calc %.6g "${rps_with[i]} / ${rps_without[i]}")")
	p99_ratio+=("$(calc %.6g "${p99_with[i]} / ${p99_without[i]}")")
done

say "overload: inflight 50, 1000 clients, $overload"
overload_ok=yes
if ! INFLIGHT_CADDY=$tmp/caddy INFLIGHT_OVERLOAD_DURATION=$overload \
	go test -count=1 -v -run '^TestOverload$' . >"$tmp/overload.txt" 2>&1; then
	overload_ok=NO
	cat "$tmp/overload.txt" >&2
fi
overload_json=$(sed -n 's/.*overload \({.*}\)$/\1/p' "$tmp/overload.txt")

say "the README's tenant example: acme 30, globex 20, anonymous 5, total 40, fair, backend 500 ms, ${tenants_secs}s; one Caddy, then three sharing redis-server"
tenants_ok=yes
if ! INFLIGHT_CADDY=$tmp/caddy INFLIGHT_TENANTS_DURATION=${tenants_secs}s \
	go test -count=1 -v -run '^TestTenantExample(Fleet)?ThroughCaddy$' . >"$tmp/tenants.txt" 2>&1; then
	tenants_ok=NO
	cat "$tmp/tenants.txt" >&2
fi
tenants_json=$(sed -n 's/.*tenants \({.*}\)$/\1/p' "$tmp/tenants.txt")
fleet_json=$(sed -n 's/.*fleet \({.*}\)$/\1/p' "$tmp/tenants.txt")

# Markdown from here on.
# ns FILE NAME [PROCS], allocs FILE NAME [PROCS]: formatted medians.
ns() { calc %.1f "$(median "$1" "$2" ns/op "${3:-}")"; }
allocs() { calc %.0f "$(median "$1" "$2" allocs/op "${3:-}")"; }
# ratio A B: A ÷ B, formatted.
ratio() { calc %.2f× "$1 / $2"; }

commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n $(git -C "$root" status --porcelain 2>/dev/null) ]]; then commit+=" (with uncommitted changes)"; fi
echo
echo "## caddy-inflight performance"
echo
echo "$started, commit $commit, $(go version | cut -d' ' -f3), $(getconf _NPROCESSORS_ONLN) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)), mode: $run_mode, -count $count -benchtime $benchtime, load average at the start $load_at_start. Times are medians."
echo
echo "| Engine and handler path | ns/op | allocs/op |"
echo "|---|--:|--:|"
echo "| engine: admit + release, one key | $(ns engine AdmitRelease) | $(allocs engine AdmitRelease) |"
echo "| engine: refuse | $(ns engine Refuse) | $(allocs engine Refuse) |"
beside0=$(median engine BesideWaiters/waiters=0 ns/op)
beside10k=$(median engine BesideWaiters/waiters=10000 ns/op)
echo "| engine: another key's admit + release, no request waiting | $(ns engine BesideWaiters/waiters=0) | $(allocs engine BesideWaiters/waiters=0) |"
echo "| engine: the same beside 10,000 waiters of one key at its cap (target ≤ 2×) | $(ns engine BesideWaiters/waiters=10000) ($(ratio "$beside10k" "$beside0")) | $(allocs engine BesideWaiters/waiters=10000) |"
echo "| \`total adaptive\`: one latency sample (two clock reads, the controller) | $(ns engine AdaptiveObserve) | $(allocs engine AdaptiveObserve) |"
echo "| with key evaluation \`{client_ip}\`: admit + release | $(ns handler AdmitReleaseClientIP) | $(allocs handler AdmitReleaseClientIP) |"
echo "| with key evaluation \`{header.X-Api-Key}\`: admit + release | $(ns handler AdmitReleaseHeader) | $(allocs handler AdmitReleaseHeader) |"
echo "| with key evaluation \`{client_ip}\`: refuse | $(ns handler RefuseClientIP) | $(allocs handler RefuseClientIP) |"
echo "| with key evaluation \`{header.X-Api-Key}\`: refuse | $(ns handler RefuseHeader) | $(allocs handler RefuseHeader) |"
echo
p1=$(median engine ParallelKeys ns/op 1)
p2=$(median engine ParallelKeys ns/op 2)
echo "| Scaling, admit + release over 10,000 keys from every CPU | -cpu 1 ns/op | -cpu 2 ns/op | throughput, 2 vs 1 CPU |"
echo "|---|--:|--:|--:|"
echo "| engine | $(ns engine ParallelKeys 1) | $(ns engine ParallelKeys 2) | $(ratio "$p1" "$p2") |"
echo
echo "| Peers: ns/op (allocs/op) | ours | oxy connlimit v2.0.0 (Traefik) | sync.Mutex + map | ours vs oxy, throughput | ours vs mutex + map, throughput |"
echo "|---|--:|--:|--:|--:|--:|"
for mode in loop parallel; do
	for keys in 1 100 10000; do
		row="Peers/mode=$mode/keys=$keys/impl"
		line="| $mode, $keys key$([[ $keys == 1 ]] || echo s) |"
		for impl in ours oxy mutexmap; do
			line+=" $(ns peers "$row=$impl") ($(allocs peers "$row=$impl")) |"
		done
		ours=$(median peers "$row=ours" ns/op)
		for impl in oxy mutexmap; do
			line+=" $(ratio "$(median peers "$row=$impl" ns/op)" "$ours") |"
		done
		echo "$line"
	done
done
echo
echo "loop: one goroutine; parallel: GOMAXPROCS goroutines. Throughput ratio = their ns/op ÷ ours (above 1: ours is faster)."
echo
without=$(median route CaddyRoute/without ns/op)
pass=$(median route CaddyRoute/pass_through ns/op)
with=$(median route CaddyRoute/with_inflight ns/op)
adaptive=$(median route CaddyRoute/with_adaptive ns/op)
echo "| Caddy route, in-process ServeHTTP, \`respond \"ok\"\` | ns/op | allocs/op |"
echo "|---|--:|--:|"
echo "| without middleware | $(ns route CaddyRoute/without) | $(allocs route CaddyRoute/without) |"
echo "| with a middleware that does nothing | $(ns route CaddyRoute/pass_through) | $(allocs route CaddyRoute/pass_through) |"
echo "| with \`inflight 100000\` | $(ns route CaddyRoute/with_inflight) | $(allocs route CaddyRoute/with_inflight) |"
echo "| added by inflight (with − without) | $(calc %.1f "$with - $without") | ratio $(ratio "$with" "$without") |"
echo "| inflight's own work (with − nothing middleware) | $(calc %.1f "$with - $pass") | |"
echo "| with \`inflight 100000 { total adaptive }\` | $(ns route CaddyRoute/with_adaptive) | $(allocs route CaddyRoute/with_adaptive) |"
echo "| added by \`total adaptive\` (adaptive − with) | $(calc %.1f "$adaptive - $with") | ratio $(ratio "$adaptive" "$with") |"
echo
echo "| End to end: Caddy binary, \`respond \"ok\"\`, $tool, $conns connections, $rounds × ${e2e_secs}s alternated | without | with \`inflight 100000\` | with ÷ without (median of rounds) |"
echo "|---|--:|--:|--:|"
echo "| throughput, req/s (median) | $(calc %.0f "$(middle "${rps_without[@]}")") | $(calc %.0f "$(middle "${rps_with[@]}")") | $(calc %.3f "$(middle "${rps_ratio[@]}")") |"
echo "| p99 latency, ms (median) | $(calc %.3f "$(middle "${p99_without[@]}")") | $(calc %.3f "$(middle "${p99_with[@]}")") | $(calc %.3f "$(middle "${p99_ratio[@]}")") |"
echo "| failed requests, all runs (must be 0) | $e2e_errors | | |"
echo
echo "| Overload: \`inflight 50\` before a backend counting its concurrency (each request held 1 s), 1000 keep-alive clients, $overload | |"
echo "|---|--:|"
for key in sent admitted refused errors backend_peak backend_served; do
	echo "| $key | $(field "$overload_json" "$key") |"
done
echo "| backend peak = 50, admitted + refused = sent, backend served = admitted | $overload_ok |"
echo
echo "| The README's tenant example: 80 + 80 + 10 clients, backend holds 500 ms, ${tenants_secs}s after a warm-up | |"
echo "|---|--:|"
for key in backend_held acme globex anonymous; do
	echo "| $key | $(field "$tenants_json" "$key") |"
done
echo "| backend held ≥ 38 of 40, acme and globex ≥ 0.40, anonymous 0.125 ± 0.02 (full runs) | $tenants_ok |"
echo
echo "| The same on three Caddys sharing \`store redis\`, the clients spread over them | |"
echo "|---|--:|"
for key in backend_held backend_most acme globex anonymous; do
	echo "| $key | $(field "$fleet_json" "$key") |"
done
echo "| backend held ≥ 38 of 40 and at most 40, each tenant ≥ 0.6 of its max-min share, anonymous ≤ 0.145 (full runs) | $tenants_ok |"

[[ $overload_ok == yes && $tenants_ok == yes && $e2e_errors == 0 ]]
