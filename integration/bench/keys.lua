-- Sets X-Key to one of KEYS keys (default 64), request by request, for
-- zone-throughput.sh.
local keys = tonumber(os.getenv("KEYS") or "64")
local n = 0
request = function()
	n = n + 1
	wrk.headers["X-Key"] = "k" .. (n % keys)
	return wrk.format(nil)
end
