package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// jsonConfig is a whole Caddy config serving one route on port: the given
// handler, then a proxy to upstream.
func jsonConfig(port int, handler, upstream string) string {
	return fmt.Sprintf(`{
	"admin": {"listen": %q, "config": {"persist": false}},
	"logging": {"logs": {"default": {"writer": {"output": "discard"}}}},
	"apps": {"http": {"servers": {"srv0": {
		"listen": ["127.0.0.1:%d"],
		"automatic_https": {"disable": true},
		"routes": [{"handle": [%s, {"handler": "reverse_proxy", "upstreams": [{"dial": %q}]}]}]
	}}}}
}`, adminAddr, port, handler, upstream)
}

func loadJSONRoute(handler string) error {
	return caddy.Load([]byte(jsonConfig(0, handler, "127.0.0.1:1")), true)
}

func TestJSONThroughAdminAPI(t *testing.T) {
	b := newBackend(t)
	port := freePort(t)
	load(t, fmt.Sprintf("http://127.0.0.1:%d {\n\trespond \"bootstrap\"\n}\n", freePort(t)))

	cfg := jsonConfig(port, `{"handler":"inflight","limits":[{"name":"client","key":"{http.vars.client_ip}","max":2}],"total":0,"zone":"","status_code":429,"retry_after":"1s","dry_run":false,"replicas":1}`, b.addr)
	resp, err := adminClient.Post("http://"+adminAddr+"/load", "application/json", bytes.NewBufferString(cfg))
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST /load: %d %s", resp.StatusCode, msg)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := client("127.0.0.1")
	done := make(chan []result)
	go func() { done <- burst(c, 2, url+"/hold") }()
	eventually(t, "2 in flight", func() bool { return b.cur.Load() == 2 })
	if r := get(context.Background(), c, url+"/"); r.status != 429 || r.retryAfter != "1" {
		t.Fatalf("third: %d Retry-After %q, want 429 and 1", r.status, r.retryAfter)
	}
	b.open()
	<-done

	// A bad config through the API is refused and the running one stays.
	bad := jsonConfig(port, `{"handler":"inflight","limits":[{"name":"client","max":0}]}`, b.addr)
	resp, err = adminClient.Post("http://"+adminAddr+"/load", "application/json", bytes.NewBufferString(bad))
	if err != nil {
		t.Fatal(err)
	}
	msg, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == 200 || !bytes.Contains(msg, []byte(`max \"0\" is not allowed`)) {
		t.Fatalf("bad config: %d %s", resp.StatusCode, msg)
	}
	if r := get(context.Background(), c, url+"/"); r.status != 200 {
		t.Fatalf("after the refused config: %d, want 200 from the running one", r.status)
	}
}
