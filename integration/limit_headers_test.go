package integration

import (
	"context"
	"io"
	"net/http"
	"testing"
)

// TestLimitHeadersOnAdmittedAndRefused: with limit_headers, an admitted
// response and a 429 both tell the client its key's cap and the units it
// has left, counting the requests its key holds (the admitted one too),
// and never another key's.
func TestLimitHeadersOnAdmittedAndRefused(t *testing.T) {
	b := newBackend(t)
	cfg, url := site(t, b, "\tinflight {\n\t\tlimit key {header.X-Key} 2\n\t\tlimit_headers key\n\t}")
	load(t, cfg)
	c := client("127.0.0.1")
	fields := func(key string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url+"/", nil)
		req.Header.Set("X-Key", key)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("RateLimit-Policy"), resp.Header.Get("RateLimit")
	}
	const policy = `"key";q=2;qu="concurrent-requests"`
	held := []<-chan result{hold(t, b, context.Background(), c, url+"/hold", "X-Key", "k")}
	for _, tc := range []struct {
		what, key string
		status    int
		left      string
		holdAfter bool
	}{
		{"admitted, one more of its key held", "k", 200, `"key";r=0`, true},
		{"refused, two of its key held", "k", 429, `"key";r=0`, false},
		{"admitted, another key", "other", 200, `"key";r=1`, false},
	} {
		status, gotPolicy, left := fields(tc.key)
		if status != tc.status || gotPolicy != policy || left != tc.left {
			t.Errorf("%s: %d, RateLimit-Policy %s, RateLimit %s; want %d, %s, %s", tc.what, status, gotPolicy, left, tc.status, policy, tc.left)
		}
		if tc.holdAfter {
			held = append(held, hold(t, b, context.Background(), c, url+"/hold", "X-Key", "k"))
		}
	}
	b.open()
	for _, h := range held {
		if r := <-h; r.status != 200 {
			t.Errorf("a held request ended with %d, want 200", r.status)
		}
	}
}
