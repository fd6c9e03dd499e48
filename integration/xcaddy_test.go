package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// xcaddyMain is the main package xcaddy writes for
// `xcaddy build --with github.com/caddy-inflight/caddy-inflight`.
const xcaddyMain = `package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/caddy-inflight/caddy-inflight"
)

func main() {
	caddycmd.Main()
}
`

// TestXcaddyStyleBuild builds Caddy the way xcaddy does (a fresh main module
// that imports this one, replaced by the checkout), then checks that the
// binary lists the modules and adapts and validates every example. It takes
// a minute or more: it is a real build.
func TestXcaddyStyleBuild(t *testing.T) {
	checkout, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	goMod := "module caddy\n\ngo 1.26.0\n\nrequire github.com/caddy-inflight/caddy-inflight v0.0.0\n\nreplace github.com/caddy-inflight/caddy-inflight => " + checkout + "\n"
	for name, content := range map[string]string{"main.go": xcaddyMain, "go.mod": goMod} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "caddy")
	run(t, dir, "go", "mod", "tidy")
	run(t, dir, "go", "build", "-o", bin, ".")

	modules := run(t, dir, bin, "list-modules")
	for _, want := range []string{"http.handlers.inflight", "admin.api.inflight"} {
		if !strings.Contains(modules, want+"\n") {
			t.Errorf("list-modules does not list %s", want)
		}
	}
	examples, _ := filepath.Glob(filepath.Join(checkout, "examples", "*Caddyfile"))
	examples = append(examples, filepath.Join(checkout, "examples", "config.json"))
	if len(examples) < 5 {
		t.Fatalf("only %d examples found", len(examples))
	}
	for _, ex := range examples {
		if strings.HasSuffix(ex, ".json") {
			run(t, dir, bin, "validate", "--config", ex)
			continue
		}
		run(t, dir, bin, "adapt", "--config", ex, "--adapter", "caddyfile")
		run(t, dir, bin, "validate", "--config", ex, "--adapter", "caddyfile")
	}
}

// run runs a command in dir, failing the test with its output if it fails.
func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}
