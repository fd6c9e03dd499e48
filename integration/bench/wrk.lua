-- Makes wrk end its report with one line of JSON, in loadgen's fields, for
-- run.sh. errors counts what wrk counts as errors: socket errors and
-- responses that are not 2xx/3xx. Latencies are in microseconds in wrk.
done = function(summary, latency, requests)
	local e = summary.errors
	local seconds = summary.duration / 1e6
	io.write(string.format(
		'{"requests":%d,"errors":%d,"seconds":%.3f,"rps":%.1f,"p50_ms":%.3f,"p99_ms":%.3f}\n',
		summary.requests, e.connect + e.read + e.write + e.timeout + e.status, seconds,
		summary.requests / seconds, latency:percentile(50) / 1e3, latency:percentile(99) / 1e3))
end
