package caddyinflight_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestConfigsValidate does what `caddy validate` does (adapt, then provision
// and validate every module without starting anything) to every config in
// examples/ and every Caddyfile and JSON config of README.md, and fails on
// any adapter warning (`caddy fmt` differences included) or warning logged
// while provisioning (such as a setting that has no effect).
func TestConfigsValidate(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	examples, _ := filepath.Glob("examples/*Caddyfile")
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
		where := fmt.Sprintf("README.md:%d", s.line)
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

// validateQuietly runs caddy.Validate on a JSON config with its default log
// sent to a file, and fails the test on an error or on any entry logged at
// WARN or above.
func validateQuietly(t *testing.T, name string, cfgJSON []byte) {
	t.Helper()
	if cfgJSON == nil {
		return
	}
	var cfg map[string]any
	if err := json.Unmarshal(caddy.RemoveMetaFields(cfgJSON), &cfg); err != nil {
		t.Errorf("%s: %v", name, err)
		return
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
		return
	}
	if err := caddy.Validate(&parsed); err != nil {
		t.Errorf("%s: validate: %v", name, err)
	}
	f, err := os.Open(logFile)
	if err != nil {
		return // nothing was logged
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		t.Errorf("%s: validate logged: %s", name, sc.Text())
	}
}
