-- Sets X-Key to one of KEYS keys (default 64), request by request, for
-- zone-throughput.sh. Thread t of THREADS (default 2) sends keys t,
-- t+THREADS, t+2*THREADS, ...: the threads share no key, so with more
-- keys than requests each key is used once.
local keys = tonumber(os.getenv("KEYS") or "64")
local threads = tonumber(os.getenv("THREADS") or "2")
local made = 0
local n = 0

function setup(thread)
	thread:set("tid", made)
	made = made + 1
end

request = function()
	wrk.headers["X-Key"] = "k" .. ((n * threads + tid) % keys)
	n = n + 1
	return wrk.format(nil)
end
