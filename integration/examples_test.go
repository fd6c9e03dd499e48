package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// loadExample adapts and runs a Caddyfile from examples/ as it is.
func loadExample(t *testing.T, name string) {
	t.Helper()
	src, err := os.ReadFile("../examples/" + name)
	if err != nil {
		t.Fatal(err)
	}
	cfg, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": name})
	if err != nil {
		t.Fatalf("adapt %s: %v", name, err)
	}
	for _, w := range warnings {
		t.Errorf("adapt %s: warning: %s", name, w.String())
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("run %s: %v", name, err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
}

// TestExampleCaddyfile runs the README's demonstration: six concurrent
// requests from one client against `inflight 3` and a slow backend.
func TestExampleCaddyfile(t *testing.T) {
	loadExample(t, "Caddyfile")
	got := countStatus(burst(client("127.0.0.1"), 6, "http://127.0.0.1:8080/"))
	if got[200] != 3 || got[429] != 3 {
		t.Fatalf("six concurrent requests: %v, want 3 × 200 and 3 × 429", got)
	}
}

// TestExampleLLMGateway streams from a fake model: the batch tenant fills
// its cap of 4 and its fifth stream waits; the interactive tenant (cap 6)
// then gets 4 streams and its fifth and sixth wait too, held back by the
// model-wide total of 8. A request of the default tenant (normal priority)
// waits behind them: when two interactive streams end, fair sharing gives
// the first freed slot to the interactive queue (high, and a tie) and the
// second to the default tenant, which has had none, where the priority
// order alone would give both to the interactive queue. Every stream
// finishes once the model ends them.
func TestExampleLLMGateway(t *testing.T) {
	model := newBackendAt(t, "127.0.0.1:11434")
	loadExample(t, "llm-gateway.Caddyfile")
	c := client("127.0.0.1")
	const admin = "127.0.0.1:2019"
	waiting := func() float64 { return metricAt(t, admin, "caddy_inflight_waiting", `zone="model"`) }
	type stream struct {
		cancel context.CancelFunc
		done   chan result
	}
	var streams []stream
	open := func(key string) {
		ctx, cancel := context.WithCancel(context.Background())
		s := stream{cancel, make(chan result, 1)}
		go func() { s.done <- get(ctx, c, "http://127.0.0.1:8090/stream", "Authorization", "Bearer "+key) }()
		streams = append(streams, s)
		eventually(t, "the stream runs or waits", func() bool { return float64(model.cur.Load())+waiting() == float64(len(streams)) })
	}
	for range 5 {
		open("key-batch")
	}
	if model.cur.Load() != 4 || waiting() != 1 {
		t.Fatalf("batch: %d streams run, %v wait; want 4 and 1", model.cur.Load(), waiting())
	}
	for range 6 {
		open("key-interactive")
	}
	if model.cur.Load() != 8 || waiting() != 3 {
		t.Fatalf("the model runs %d streams and %v wait; want 8 and 3", model.cur.Load(), waiting())
	}
	if got := metricAt(t, admin, "caddy_inflight_requests", `zone="model"`, `limit="tenant"`); got != 8 {
		t.Fatalf("tenant slots held = %v, want 8", got)
	}
	// Checked before any client leaves: a slot is given back when Caddy's
	// handler returns, which can be a moment before the model notices the
	// client has gone, so the model may then briefly see one more.
	if p := model.peak.Load(); p != 8 {
		t.Fatalf("the model saw %d streams at once, want the total of 8", p)
	}
	light := make(chan result, 1)
	go func() { light <- get(context.Background(), c, "http://127.0.0.1:8090/") }()
	eventually(t, "the default tenant waits", func() bool { return waiting() == 4 })
	for _, s := range streams[5:7] { // two running interactive streams end: their clients leave
		s.cancel()
		<-s.done
	}
	select {
	case r := <-light:
		if r.status != 200 {
			t.Fatalf("default tenant: %d, want 200", r.status)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("default tenant still waiting after two slots freed: the interactive queue took both")
	}
	eventually(t, "the freed slots go to the waiting interactive streams, the total full again", func() bool {
		return metricAt(t, admin, "caddy_inflight_requests", `zone="model"`, `limit="tenant"`) == 8 && waiting() == 1
	})
	model.open()
	for _, s := range append(streams[:5], streams[7:]...) {
		if r := <-s.done; r.status != 200 || !strings.Contains(r.body, "data: end") {
			t.Fatalf("stream: %d %q %v", r.status, r.body, r.err)
		}
	}
}

// TestExampleAPIKeys: a key may have 2 in flight; the third waits its 2s and
// is refused with the example's JSON error naming the limit. Requests without
// a key are not limited per key but fall to the default tenant, capped at 2.
func TestExampleAPIKeys(t *testing.T) {
	b := newBackendAt(t, "127.0.0.1:9001")
	loadExample(t, "api-keys.Caddyfile")
	c := client("127.0.0.1")
	url := "http://127.0.0.1:8070"
	held := []<-chan result{
		hold(t, b, context.Background(), c, url+"/hold", "X-Api-Key", "key-acme-1"),
		hold(t, b, context.Background(), c, url+"/hold", "X-Api-Key", "key-acme-1"),
	}
	// The tenant acme (max 4) still has room through its other key.
	if r := get(context.Background(), c, url+"/", "X-Api-Key", "key-acme-2"); r.status != 200 {
		t.Fatalf("acme's second key: %d, want 200", r.status)
	}
	r := get(context.Background(), c, url+"/", "X-Api-Key", "key-acme-1")
	want := `{"error":{"type":"rate_limit_exceeded","limit_type":"inflight","details":{"inflight_dimension":"key"}}}`
	if r.status != 429 || r.body != want || r.retryAfter != "1" {
		t.Fatalf("third request of one key: %d Retry-After %q body %s\nwant 429, 1 and %s", r.status, r.retryAfter, r.body, want)
	}
	held = append(held, hold(t, b, context.Background(), c, url+"/hold"), hold(t, b, context.Background(), c, url+"/hold"))
	r = get(context.Background(), c, url+"/")
	if want := strings.Replace(want, `"key"`, `"tenant"`, 1); r.status != 429 || r.body != want {
		t.Fatalf("third request without a key: %d %s\nwant 429 and %s", r.status, r.body, want)
	}
	b.open()
	for _, h := range held {
		<-h
	}
}

// TestExampleConfigJSON loads examples/config.json through the admin API,
// in front of a backend outside that config (as examples/slow-backend is),
// and raises its limit with the README's PATCH while 3 requests are held:
// they survive the change, still count against the new max of 5, and
// finish with the backend's own response.
func TestExampleConfigJSON(t *testing.T) {
	b := newBackendAt(t, "127.0.0.1:8081")
	load(t, fmt.Sprintf("http://127.0.0.1:%d {\n\trespond \"bootstrap\"\n}\n", freePort(t)))
	cfg, err := os.ReadFile("../examples/config.json")
	if err != nil {
		t.Fatal(err)
	}
	// The example's admin endpoint is 127.0.0.1:2019; keep the tests' own.
	cfg = bytes.Replace(cfg, []byte(`"listen": "127.0.0.1:2019"`), []byte(`"listen": "`+adminAddr+`"`), 1)
	adminDo(t, http.MethodPost, "/load", string(cfg))
	const url = "http://127.0.0.1:8080"
	c := client("127.0.0.1")
	var held []<-chan result
	for range 3 {
		held = append(held, hold(t, b, context.Background(), c, url+"/hold"))
	}
	if r := get(context.Background(), c, url+"/"); r.status != 429 || r.retryAfter != "1" {
		t.Fatalf("fourth under max 3: %d Retry-After %q, want 429 and 1", r.status, r.retryAfter)
	}
	adminDo(t, http.MethodPatch, "/id/inflight/limits", `[{"name":"client","key":"{http.vars.client_ip}","max":5}]`)
	c.CloseIdleConnections() // kept connections belong to the old server
	if got := metric(t, "caddy_inflight_requests", `limit="client"`); got != 3 || b.cur.Load() != 3 {
		t.Fatalf("after the PATCH: %v slots held and %d requests at the backend, want the 3 carried over", got, b.cur.Load())
	}
	held = append(held, hold(t, b, context.Background(), c, url+"/hold"), hold(t, b, context.Background(), c, url+"/hold"))
	if r := get(context.Background(), c, url+"/"); r.status != 429 {
		t.Fatalf("sixth under max 5 with 3 carried over: %d, want 429", r.status)
	}
	b.open()
	for _, h := range held {
		if r := <-h; r.status != 200 || r.body != "ok" {
			t.Fatalf("held request: %d %q %v, want the backend's 200 ok", r.status, r.body, r.err)
		}
	}
}

func adminDo(t *testing.T, method, path, body string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+adminAddr+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := adminClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, msg)
	}
}
