-- Sets X-Key to one of 64 keys, request by request, for
-- zone-throughput.sh.
local n = 0
request = function()
	n = n + 1
	wrk.headers["X-Key"] = "k" .. (n % 64)
	return wrk.format(nil)
end
