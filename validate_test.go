package caddyinflight_test

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestConfigsValidate does what `caddy validate` does (adapt, then provision
// and validate every module without starting anything) to every config in
// examples/ and every Caddyfile and JSON config of the documents (README.md
// and docs/*.md), and fails on
// any adapter warning (`caddy fmt` differences included) or warning logged
// while provisioning (such as a setting that has no effect).
func TestConfigsValidate(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	examples, _ := filepath.Glob("examples/*Caddyfile")
	// caddy-l4's layer4 app is not built here: layer4/integration checks it.
	examples = slices.DeleteFunc(examples, func(name string) bool { return name == "examples/layer4.Caddyfile" })
	examples = append(examples, "examples/config.json")
	if len(examples) < 5 {
		t.Fatalf("only %d examples found", len(examples))
	}
	for _, name := range examples {
		raw, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := raw
		if !strings.HasSuffix(name, ".json") {
			cfg = adaptClean(t, name, raw)
		}
		validateQuietly(t, name, cfg)
	}
	for _, s := range readmeSnippets(t) {
		where := s.where()
		if s.json != nil {
			validateQuietly(t, where, s.json)
			continue
		}
		if s.kind != "inline" {
			validateQuietly(t, where, adaptClean(t, where, []byte(s.caddyfile)))
		}
	}
}

// adaptClean adapts a Caddyfile, failing the test on an error or a warning.
func adaptClean(t *testing.T, name string, caddyfile []byte) []byte {
	t.Helper()
	cfg, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(caddyfile, map[string]any{"filename": name})
	if err != nil {
		t.Errorf("%s: adapt: %v", name, err)
	}
	for _, w := range warnings {
		t.Errorf("%s: adapt: warning: %s", name, w.String())
	}
	return cfg
}

// redisAbsent is the warning of a store whose Redis does not answer. The
// Redis addresses of the README's fleet snippets have no Redis behind them
// here, so it, and go-redis's own dial errors (logger redis), are the only
// entries a config may log.
const redisAbsent = "redis store unreachable at startup"

// validateQuietly runs caddy.Validate on a JSON config and fails the test on
// an error or on any entry logged at WARN or above but those of an absent
// Redis.
func validateQuietly(t *testing.T, name string, cfgJSON []byte) {
	t.Helper()
	for _, line := range validateLogged(t, name, cfgJSON) {
		if !strings.Contains(line, redisAbsent) && !strings.Contains(line, `"logger":"redis"`) {
			t.Errorf("%s: validate logged: %s", name, line)
		}
	}
}

// validateLogged runs caddy.Validate on a JSON config with its default log
// sent to a file, fails the test on an error, and returns the entries
// logged at WARN or above.
func validateLogged(t *testing.T, name string, cfgJSON []byte) []string {
	t.Helper()
	if cfgJSON == nil {
		return nil
	}
	var cfg map[string]any
	if err := json.Unmarshal(caddy.RemoveMetaFields(cfgJSON), &cfg); err != nil {
		t.Errorf("%s: %v", name, err)
		return nil
	}
	logFile := filepath.Join(t.TempDir(), "log")
	logging, _ := cfg["logging"].(map[string]any)
	if logging == nil {
		logging = map[string]any{}
		cfg["logging"] = logging
	}
	logs, _ := logging["logs"].(map[string]any)
	if logs == nil {
		logs = map[string]any{}
		logging["logs"] = logs
	}
	def, _ := logs["default"].(map[string]any)
	if def == nil {
		def = map[string]any{}
		logs["default"] = def
	}
	def["writer"] = map[string]any{"output": "file", "filename": logFile}
	def["encoder"] = map[string]any{"format": "json"}
	def["level"] = "WARN"
	var parsed caddy.Config
	raw, _ := json.Marshal(cfg)
	if err := json.Unmarshal(raw, &parsed); err != nil {
		t.Errorf("%s: %v", name, err)
		return nil
	}
	if err := caddy.Validate(&parsed); err != nil {
		t.Errorf("%s: validate: %v", name, err)
	}
	f, err := os.Open(logFile)
	if err != nil {
		return nil // nothing was logged
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

// TestValidateSaysRedisIsUnreachable: a store whose Redis does not answer is
// reported when the config is loaded (caddy validate, startup), with the
// reason, not first by a request.
func TestValidateSaysRedisIsUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	cfg := adaptClean(t, "fleet", []byte("example.com {\n\tinflight 5 {\n\t\tstore redis {\n\t\t\taddress "+addr+"\n\t\t}\n\t}\n}\n"))
	lines := validateLogged(t, "fleet", cfg)
	for _, line := range lines {
		if strings.Contains(line, redisAbsent) && strings.Contains(line, addr) && strings.Contains(line, "connection refused") {
			return
		}
	}
	t.Fatalf("validate logged %q, want the warning %q naming %s and the connection refusal", lines, redisAbsent, addr)
}

// `caddy validate` warns of a password Redis refuses, with the reason, and
// never shows the password.
func TestValidateSaysRedisRefusesThePassword(t *testing.T) {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server is not installed: apt-get install redis-server (.ci/run installs it)")
		}
		t.Skip("redis-server is not installed (apt-get install redis-server): skipped here, a failure in CI")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	redis := exec.Command(path, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--requirepass", "right-Pa55")
	if err := redis.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { redis.Process.Kill(); redis.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("redis-server does not listen")
		}
	}
	cfg := adaptClean(t, "fleet", []byte("example.com {\n\tinflight 5 {\n\t\tstore redis {\n\t\t\taddress "+addr+"\n\t\t\tpassword wrong-Pa55\n\t\t}\n\t}\n}\n"))
	lines := validateLogged(t, "fleet", cfg)
	for _, line := range lines {
		if strings.Contains(line, "Pa55") {
			t.Fatalf("validate logged the password: %s", line)
		}
	}
	for _, line := range lines {
		if strings.Contains(line, redisAbsent) && strings.Contains(line, "authentication failed: wrong username or password") {
			return
		}
	}
	t.Fatalf("validate logged %q, want the warning %q with the reason: authentication failed", lines, redisAbsent)
}

// handlerConfig is a whole config with one inflight handler, given as JSON.
func handlerConfig(handler string) []byte {
	return []byte(`{"apps": {"http": {"servers": {"s": {"listen": ["127.0.0.1:0"], "routes": [{"handle": [` + handler + `]}]}}}}}`)
}

// TestJSONRefusesWhatTheCaddyfileRefuses: a JSON config is refused at load
// for the values the Caddyfile refuses at their line: a fixed cap beyond
// the 40 bits of units a zone counts, a priority that is no class, a fixed
// weight out of range, a Redis address without a port, max_waiting_per_key
// above max_waiting, retry_after_ms above retry_after, a Redis lease below
// 1s. Each error names the setting, the value and what is allowed.
func TestJSONRefusesWhatTheCaddyfileRefuses(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	for _, tc := range []struct{ handler, want string }{
		{`{"handler": "inflight", "limits": [{"name": "tenant", "max": 1099511627776}]}`,
			`max "1099511627776" is not allowed: want an integer from 1 to 1099511627775 (2^40-1), or a placeholder`},
		{`{"handler": "inflight", "limits": [{"name": "tenant", "max": "9223372036854775807"}]}`,
			`max "9223372036854775807" is not allowed: want an integer from 1 to 1099511627775 (2^40-1), or a placeholder`},
		{`{"handler": "inflight", "total": 2199023255552}`,
			`total 2199023255552 is not allowed: want an integer from 1 to 1099511627775 (2^40-1)`},
		{`{"handler": "inflight", "total_adaptive": {"max": 1099511627776}}`,
			`total adaptive: max 1099511627776 is not allowed: want an integer from min (1) to 1099511627775 (2^40-1)`},
		{`{"handler": "inflight", "total": 5, "wait": "1s", "priority": "urgent"}`,
			`priority "urgent" is not allowed: want high, normal or low, or a placeholder such as {tenant_priority}`},
		{`{"handler": "inflight", "limits": [{"name": "tenant", "max": 5}], "wait": "1s", "fair": "tenant", "weight": "5000"}`,
			`weight "5000" is not allowed: want a number from 0.001 to 1000`},
		{`{"handler": "inflight", "total": 5, "store": {"type": "redis", "address": ["redis.internal"]}}`,
			`address "redis.internal" is not allowed: want host:port, such as 127.0.0.1:6379`},
		{`{"handler": "inflight", "total": 5, "wait": "1s", "max_waiting": 10, "max_waiting_per_key": 100}`,
			`max_waiting_per_key 100 is not allowed above max_waiting (10)`},
		{`{"handler": "inflight", "total": 5, "retry_after": "1s", "retry_after_ms": "5s"}`,
			`retry_after_ms "5s" is not allowed: want auto or a positive duration up to retry_after (1s)`},
		{`{"handler": "inflight", "total": 5, "store": {"type": "redis", "address": ["127.0.0.1:6379"], "lease": "500ms"}}`,
			`lease 500ms is not allowed: want at least 1s`},
	} {
		var cfg caddy.Config
		if err := json.Unmarshal(handlerConfig(tc.handler), &cfg); err != nil {
			t.Fatal(err)
		}
		if err := caddy.Validate(&cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to contain %q", tc.handler, err, tc.want)
		}
	}
}

// TestPriorityClassesAndPlaceholdersLoad: the classes, in any case, and a
// placeholder are a priority.
func TestPriorityClassesAndPlaceholdersLoad(t *testing.T) {
	for _, p := range []string{"high", "Normal", "LOW", "{tenant_priority}"} {
		validateQuietly(t, p, handlerConfig(`{"handler": "inflight", "total": 5, "wait": "1s", "priority": "`+p+`"}`))
	}
}

// TestValidateWarnsOfWhatAStoreIgnoresOrAssumes: a store with no address
// uses Redis's default, 127.0.0.1:6379, which every instance must reach as
// the same Redis: that is logged when the config loads, naming the
// setting. limit_headers works with a store (the fleet's level): no
// warning names it.
func TestValidateWarnsOfWhatAStoreIgnoresOrAssumes(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	headers := adaptClean(t, "limit_headers", []byte("example.com {\n\tinflight 5 {\n\t\tlimit_headers client\n\t\tstore redis {\n\t\t\taddress "+addr+"\n\t\t}\n\t}\n}\n"))
	if lines := validateLogged(t, "limit_headers", headers); slices.ContainsFunc(lines, func(line string) bool { return strings.Contains(line, `"setting":"limit_headers"`) }) {
		t.Errorf("limit_headers with a store: validate logged %q, want no warning naming it", lines)
	}
	for _, tc := range []struct{ name, block, want string }{
		{"no address", "\t\tstore redis\n", `"address":"127.0.0.1:6379"`},
	} {
		cfg := adaptClean(t, tc.name, []byte("example.com {\n\tinflight 5 {\n"+tc.block+"\t}\n}\n"))
		lines := validateLogged(t, tc.name, cfg)
		if !slices.ContainsFunc(lines, func(line string) bool {
			return strings.Contains(line, `"level":"warn"`) && strings.Contains(line, tc.want) && !strings.Contains(line, redisAbsent)
		}) {
			t.Errorf("%s: validate logged %q, want a warning with %s", tc.name, lines, tc.want)
		}
	}
}
