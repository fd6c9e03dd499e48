package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

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

// TestExampleLLMGateway streams from a fake model: the batch tenant (cap 2)
// opens three streams; two stream, the third waits, and all three finish
// once the model ends the first two.
func TestExampleLLMGateway(t *testing.T) {
	model := newBackendAt(t, "127.0.0.1:11434")
	loadExample(t, "llm-gateway.Caddyfile")
	c := client("127.0.0.1")
	done := make(chan result, 3)
	for range 3 {
		go func() {
			done <- get(context.Background(), c, "http://127.0.0.1:8090/stream", "Authorization", "Bearer key-batch")
		}()
	}
	eventually(t, "two streams run and one waits", func() bool {
		return model.cur.Load() == 2 && metricAt(t, "127.0.0.1:2019", "caddy_inflight_waiting", `zone="model"`) == 1
	})
	if p := model.peak.Load(); p != 2 {
		t.Fatalf("model saw %d batch streams at once, want 2", p)
	}
	// The interactive tenant has its own cap and is not held up.
	if r := get(context.Background(), c, "http://127.0.0.1:8090/", "Authorization", "Bearer key-interactive"); r.status != 200 {
		t.Fatalf("interactive tenant: %d, want 200", r.status)
	}
	model.open()
	for range 3 {
		if r := <-done; r.status != 200 || !strings.Contains(r.body, "data: end") {
			t.Fatalf("stream: %d %q", r.status, r.body)
		}
	}
}

// TestExampleAPIKeys: a key may have 2 in flight; the third waits its 2s and
// is refused with the example's JSON error naming the limit.
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
	b.open()
	for _, h := range held {
		<-h
	}
}

// TestExampleConfigJSON loads examples/config.json through the admin API and
// fires six requests at once against its max of 3.
func TestExampleConfigJSON(t *testing.T) {
	load(t, fmt.Sprintf("http://127.0.0.1:%d {\n\trespond \"bootstrap\"\n}\n", freePort(t)))
	cfg, err := os.ReadFile("../examples/config.json")
	if err != nil {
		t.Fatal(err)
	}
	// The example's admin endpoint is 127.0.0.1:2019; keep the tests' own.
	cfg = bytes.Replace(cfg, []byte(`"listen": "127.0.0.1:2019"`), []byte(`"listen": "`+adminAddr+`"`), 1)
	adminDo(t, http.MethodPost, "/load", string(cfg))
	got := countStatus(burst(client("127.0.0.1"), 6, "http://127.0.0.1:8080/"))
	if got[200] != 3 || got[429] != 3 {
		t.Fatalf("six concurrent requests: %v, want 3 × 200 and 3 × 429", got)
	}
}

// TestPatchLimitLive raises a limit with a PATCH through the admin API (as
// the README shows, by the handler's @id) while requests are in flight: the
// counts carry over into the new config.
func TestPatchLimitLive(t *testing.T) {
	b := newBackend(t)
	port := freePort(t)
	load(t, fmt.Sprintf("http://127.0.0.1:%d {\n\trespond \"bootstrap\"\n}\n", freePort(t)))
	cfg := jsonConfig(port, `{"@id":"inflight","handler":"inflight","limits":[{"name":"client","max":3}]}`, b.addr)
	adminDo(t, http.MethodPost, "/load", cfg)
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := client("127.0.0.1")
	var held []<-chan result
	for range 3 {
		held = append(held, hold(t, b, context.Background(), c, url+"/hold"))
	}
	if r := get(context.Background(), c, url+"/"); r.status != 429 {
		t.Fatalf("fourth under max 3: %d, want 429", r.status)
	}
	adminDo(t, http.MethodPatch, "/id/inflight/limits", `[{"name":"client","key":"{http.vars.client_ip}","max":5}]`)
	c.CloseIdleConnections() // kept connections belong to the old server
	if got := metric(t, "caddy_inflight_requests", `limit="client"`); got != 3 {
		t.Fatalf("in flight after the PATCH = %v, want the 3 carried over", got)
	}
	held = append(held, hold(t, b, context.Background(), c, url+"/hold"), hold(t, b, context.Background(), c, url+"/hold"))
	if r := get(context.Background(), c, url+"/"); r.status != 429 {
		t.Fatalf("sixth under max 5 with 3 carried over: %d, want 429", r.status)
	}
	b.open()
	for _, h := range held {
		if r := <-h; r.status != 200 {
			t.Fatalf("held request: %d", r.status)
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

// TestExampleDashboardQueriesExportedMetrics checks that every metric the
// Grafana dashboard queries is one the module exports.
func TestExampleDashboardQueriesExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile("../examples/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	// Make every series exist: a zone with per-key metrics, a wait, a refusal.
	b := newBackend(t)
	cfg, url := site(t, b, "\tinflight 1 {\n\t\tzone dash\n\t\twait 10ms\n\t\tmetrics per_key\n\t}")
	load(t, cfg)
	c := client("127.0.0.1")
	done := hold(t, b, context.Background(), c, url+"/hold")
	get(context.Background(), c, url+"/")
	exported := adminGet(t, "/metrics")
	b.open()
	<-done

	names := regexp.MustCompile(`caddy_inflight_[a-z_]+`)
	queried := 0
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			for _, name := range names.FindAllString(target.Expr, -1) {
				queried++
				if !strings.Contains(exported, "\n"+name+"{") {
					t.Errorf("panel %q queries %s, which the module does not export", p.Title, name)
				}
			}
		}
	}
	if queried < 6 {
		t.Fatalf("only %d metric references found in the dashboard", queried)
	}
}
