package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// layer4Blocks returns the caddyfile-layer4 blocks of README.md and
// docs/*.md (../readme_test.go leaves them to this test), by file:line.
func layer4Blocks(t *testing.T) map[string]string {
	t.Helper()
	docs, _ := filepath.Glob("../../docs/*.md")
	fence := regexp.MustCompile("^```+\\s*(\\S*)\\s*$")
	blocks := map[string]string{}
	for _, file := range append([]string{"../../README.md"}, docs...) {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(raw), "\n")
		for i := 0; i < len(lines); i++ {
			m := fence.FindStringSubmatch(lines[i])
			if m == nil {
				continue
			}
			start := i
			var body []string
			for i++; i < len(lines) && !fence.MatchString(lines[i]); i++ {
				body = append(body, lines[i])
			}
			if m[1] == "caddyfile-layer4" {
				blocks[fmt.Sprintf("%s:%d", strings.TrimPrefix(file, "../../"), start+1)] = strings.Join(body, "\n") + "\n"
			}
		}
	}
	if len(blocks) < 2 {
		t.Fatalf("found %d caddyfile-layer4 blocks in README.md and docs/, want the README's and docs/layer4.md's", len(blocks))
	}
	return blocks
}

// TestDocsValidate: every caddyfile-layer4 block of the documents and
// examples/layer4.Caddyfile are `caddy fmt` clean and pass `caddy
// validate` with no warning.
func TestDocsValidate(t *testing.T) {
	configs := layer4Blocks(t)
	example, err := os.ReadFile("../../examples/layer4.Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	configs["examples/layer4.Caddyfile"] = string(example)
	for where, cfg := range configs {
		dir := t.TempDir()
		file := filepath.Join(dir, "Caddyfile")
		if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		formatted, err := exec.Command(caddyBinary(t), "fmt", file).Output()
		if err != nil || string(formatted) != cfg {
			t.Errorf("%s: not caddy fmt clean (%v):\n%s", where, err, formatted)
		}
		cmd := exec.Command(caddyBinary(t), "validate", "--adapter", "caddyfile", "--config", file)
		cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
		out, err := cmd.CombinedOutput()
		if err != nil || strings.Contains(string(out), `"level":"warn"`) || strings.Contains(string(out), `"level":"error"`) {
			t.Errorf("%s: caddy validate: %v\n%s", where, err, out)
		}
	}
}

// TestExampleLayer4 runs examples/layer4.Caddyfile as it is, its
// database a local echo server: 20 connections per client through the
// proxy, the 21st held until one closes; the HTTP site behind the
// listener wrapper serves and counts its connections.
func TestExampleLayer4(t *testing.T) {
	db, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	go func() {
		for {
			conn, err := db.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(conn, conn); conn.Close() }()
		}
	}()
	dir := t.TempDir()
	cmd := exec.Command(caddyBinary(t), "run", "--adapter", "caddyfile", "--config", "../../examples/layer4.Caddyfile")
	cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir, "DB_UPSTREAM="+db.Addr().String())
	log := new(syncBuffer)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		if t.Failed() {
			t.Logf("caddy log:\n%s", log.String())
		}
	})
	c := &caddy{admin: "127.0.0.1:2019"}
	waitForPort(t, c.admin)
	for _, at := range []string{"127.0.0.1:5432", "127.0.0.1:8080"} {
		waitForListener(t, at)
	}

	var open []net.Conn
	for range 20 {
		conn := dial(t, "127.0.0.1:5432", "127.0.0.1")
		if !echoed(t, conn) {
			t.Fatal("a connection under inflight 20 was closed")
		}
		open = append(open, conn)
	}
	waiting := dial(t, "127.0.0.1:5432", "127.0.0.1")
	waiting.Write([]byte("ping"))
	eventually(t, "the 21st connection waits", func() bool { return c.zone(t, "layer4 :5432#1").Waiting == 1 })
	open[0].Close()
	if !readEcho(t, waiting, 30e9) {
		t.Fatal("the waiting connection was closed, not served, when one closed")
	}

	resp, err := http.Get("http://127.0.0.1:8080/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if string(body) != "hello" {
		t.Fatalf("the HTTP site answered %q", body)
	}
	if held := c.held(t, "layer4 :8080#1"); held != 1 {
		t.Errorf("the listener wrapper's zone holds %d with one kept-alive HTTP connection, want 1", held)
	}
	resp.Body.Close()
}
