-- Sets X-Key to one of KEYS keys (default 64), request by request, for
-- zone-throughput.sh. Thread t of THREADS (default 2) sends keys t,
-- t+THREADS, t+2*THREADS, ...: the threads share no key, so with more
-- keys than requests each key is used once. With WARMUP=1 a thread starts
-- half-way through the keys: with few keys the warm-up sends the same
-- keys as the run after it, and with more keys than the two runs send
-- together (a million), none of the run's.
local keys = tonumber(os.getenv("KEYS") or "64")
local threads = tonumber(os.getenv("THREADS") or "2")
local made = 0
local n = 0
if os.getenv("WARMUP") == "1" then
	n = math.floor(keys / 2 / threads)
end

function setup(thread)
	thread:set("tid", made)
	made = made + 1
end

request = function()
	wrk.headers["X-Key"] = "k" .. ((n * threads + tid) % keys)
	n = n + 1
	return wrk.format(nil)
end
