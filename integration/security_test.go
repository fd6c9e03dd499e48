package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// hashOf is how logs, events and metrics show a key: a short SHA-256.
func hashOf(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "h:" + hex.EncodeToString(sum[:6])
}

func adminGet(t *testing.T, path string) string {
	t.Helper()
	return adminGetAt(t, adminAddr, path)
}

// adminGetAt is adminGet for an admin endpoint at another address.
func adminGetAt(t *testing.T, admin, path string) string {
	t.Helper()
	resp, err := adminClient.Get("http://" + admin + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
	}
	return string(body)
}

// TestSecretKeysStayHashed sends an API key as a limit's key with per-key
// metrics on and debug logs (which include every event) written to a file:
// the raw key must appear in none of logs, events, metrics or the admin
// API, and its hash must.
func TestSecretKeysStayHashed(t *testing.T) {
	const secret = "sk-live-SECRET-0123456789"
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	b := newBackend(t)
	port := freePort(t)
	cfg := loggingTo(logFile, "DEBUG") + fmt.Sprintf(`http://127.0.0.1:%d {
	inflight {
		limit key {header.X-Api-Key} 1
		zone secrets
		metrics per_key
	}
	reverse_proxy %s
}
`, port, b.addr)
	if err := loadRaw(cfg); err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := client("127.0.0.1")
	done := hold(t, b, context.Background(), c, url+"/hold", "X-Api-Key", secret)
	if r := get(context.Background(), c, url+"/", "X-Api-Key", secret); r.status != 429 {
		t.Fatalf("second request with the key: %d, want 429", r.status)
	}
	metrics := adminGet(t, "/metrics")
	state := adminGet(t, "/inflight/")
	b.open()
	<-done

	raw, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	// The module's own log lines and the events; Caddy's request logs show
	// request headers unless the operator filters them (see the README).
	var logs []string
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.Contains(line, `"logger":"http.handlers.inflight"`) || strings.Contains(line, `"logger":"events"`) {
			logs = append(logs, line)
		}
	}
	for name, text := range map[string]string{"logs and events": strings.Join(logs, "\n"), "metrics": metrics, "admin API": state} {
		if strings.Contains(text, secret) {
			t.Errorf("the raw key appears in the %s", name)
		}
		if !strings.Contains(text, hashOf(secret)) {
			t.Errorf("the key's hash %s does not appear in the %s", hashOf(secret), name)
		}
	}
	if !strings.Contains(strings.Join(logs, "\n"), `"inflight_refused"`) {
		t.Error("no inflight_refused event in the debug log")
	}
	// The series is removed when the key's count reaches zero.
	eventually(t, "the per-key series is gone", func() bool {
		return !strings.Contains(adminGet(t, "/metrics"), hashOf(secret))
	})
}

func TestAdminAPIShowsWhoHolds(t *testing.T) {
	b := newBackend(t)
	cfg, url := site(t, b, "\tinflight {\n\t\tlimit tenant {header.X-Tenant} 5\n\t\ttotal 10\n\t\tzone api\n\t}")
	load(t, cfg)
	c := client("127.0.0.1")
	var held []<-chan result
	for _, tenant := range []string{"big", "big", "big", "small"} {
		held = append(held, hold(t, b, context.Background(), c, url+"/hold", "X-Tenant", tenant))
	}
	var state struct {
		Zones []struct {
			Zone   string
			Limits []struct {
				Name string
				Held int64
				Keys int
			}
			Total   *int64
			Waiting int64
			TopKeys []struct {
				Limit, Key string
				Held       int64
			} `json:"top_keys"`
		}
	}
	if err := json.Unmarshal([]byte(adminGet(t, "/inflight/")), &state); err != nil {
		t.Fatal(err)
	}
	if len(state.Zones) != 1 {
		t.Fatalf("zones: %+v, want one", state.Zones)
	}
	z := state.Zones[0]
	if z.Zone != "api" || len(z.Limits) != 1 || z.Limits[0].Held != 4 || z.Limits[0].Keys != 2 || z.Total == nil || *z.Total != 4 {
		t.Fatalf("zone state %+v, want api with 4 held over 2 keys, total 4", z)
	}
	if len(z.TopKeys) != 2 || z.TopKeys[0].Held != 3 || z.TopKeys[1].Held != 1 {
		t.Fatalf("top keys %+v, want 3 then 1", z.TopKeys)
	}
	b.open()
	for _, d := range held {
		<-d
	}
}

func TestIneffectiveSettingsWarn(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	port := freePort(t)
	err := loadRaw(loggingTo(logFile, "INFO") + fmt.Sprintf(`http://127.0.0.1:%d {
	inflight 5 {
		max_waiting 10
		priority {header.X-Priority}
	}
	respond "ok"
}
`, port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddy.Stop() })
	raw, _ := os.ReadFile(logFile)
	for _, setting := range []string{"max_waiting", "priority"} {
		if !strings.Contains(string(raw), `"msg":"setting has no effect","setting":"`+setting+`"`) {
			t.Errorf("no warning for %s without wait in:\n%s", setting, raw)
		}
	}
}

// loggingTo is the test globals with logs written to file at level.
func loggingTo(file, level string) string {
	return fmt.Sprintf("{\n\tadmin %s\n\tdefault_bind 127.0.0.1\n\tauto_https off\n\tpersist_config off\n\tlog {\n\t\toutput file %s\n\t\tlevel %s\n\t}\n}\n", adminAddr, file, level)
}
