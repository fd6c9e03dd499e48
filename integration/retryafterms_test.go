package integration

import (
	"context"
	"fmt"
	"strconv"
	"testing"
)

// TestRetryAfterMs: a refusal carries retry-after-ms beside Retry-After:
// the fixed value; or, with auto, none until the zone has seen 4
// releases, then hints that tell successive refused requests later and
// later times (one slot apart, at a rate of a slot every 50 ms), within
// 10 ms and retry_after, while Retry-After stays whole seconds.
func TestRetryAfterMs(t *testing.T) {
	b := newBackend(t)
	fixedCfg, fixedURL := site(t, b, "\tinflight 1 {\n\t\tzone retry-fixed\n\t\tretry_after 2s\n\t\tretry_after_ms 250ms\n\t}")
	hb := newHoldBackend(t)
	autoPort := freePort(t)
	autoURL := fmt.Sprintf("http://127.0.0.1:%d/", autoPort)
	autoCfg := fmt.Sprintf("http://127.0.0.1:%d {\n\tinflight 1 {\n\t\tzone retry-auto\n\t\tretry_after 2s\n\t\tretry_after_ms auto\n\t}\n\treverse_proxy %s\n}\n", autoPort, hb.addr)
	load(t, fixedCfg+autoCfg)
	c := client("127.0.0.1")

	held := make(chan result, 1)
	go func() { held <- get(context.Background(), c, fixedURL+"/hold") }()
	eventually(t, "one request held", func() bool { return b.cur.Load() == 1 })
	if r := get(context.Background(), c, fixedURL+"/hold"); r.status != 429 || r.retryAfter != "2" || r.retryAfterMs != "250" {
		t.Fatalf("fixed: status %d, Retry-After %q, retry-after-ms %q; want 429, 2 and 250", r.status, r.retryAfter, r.retryAfterMs)
	}
	b.open()
	<-held

	slow := func() result { return get(context.Background(), c, autoURL, "X-Hold", "50") }
	if r := slow(); r.status != 200 {
		t.Fatalf("auto zone: %d, want 200", r.status)
	}
	go func() { held <- get(context.Background(), c, autoURL, "X-Hold", "2000") }()
	eventually(t, "the auto zone's slot held", func() bool {
		return metric(t, "caddy_inflight_requests", `zone="retry-auto"`) == 1
	})
	if r := slow(); r.status != 429 || r.retryAfterMs != "" {
		t.Fatalf("auto, 1 release seen: status %d, retry-after-ms %q; want 429 and none (fewer than 4 releases)", r.status, r.retryAfterMs)
	}
	<-held
	for range 6 { // releases a slot every 50 ms: the rate the hints go by
		if r := slow(); r.status != 200 {
			t.Fatalf("auto zone: %d, want 200", r.status)
		}
	}
	go func() { held <- get(context.Background(), c, autoURL, "X-Hold", "2000") }()
	eventually(t, "the auto zone's slot held", func() bool {
		return metric(t, "caddy_inflight_requests", `zone="retry-auto"`) == 1
	})
	var last int
	for i := range 3 {
		r := slow()
		ms, err := strconv.Atoi(r.retryAfterMs)
		if r.status != 429 || r.retryAfter != "2" || err != nil || ms < 10 || ms > 2000 {
			t.Fatalf("auto, refusal %d: status %d, Retry-After %q, retry-after-ms %q; want 429, 2 and 10 to 2000", i, r.status, r.retryAfter, r.retryAfterMs)
		}
		t.Logf("auto, refusal %d: retry-after-ms %d", i, ms)
		if i > 0 && ms <= last {
			t.Fatalf("auto, refusal %d: told %d ms, the previous one %d ms: want later (one slot after it)", i, ms, last)
		}
		last = ms
	}
	<-held
}
