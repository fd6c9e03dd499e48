package caddyfile

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddy-inflight/caddy-inflight/inflight/redisstore"
)

var update = flag.Bool("update", false, "rewrite the expected JSON of the fixtures that adapt")

// TestAdapt runs every fixture in testdata: a Caddyfile, a line of ten
// dashes, then either the JSON it adapts to or, for a bad Caddyfile, the text
// the adapt error must contain.
func TestAdapt(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			caddyfile, want, ok := strings.Cut(string(raw), "\n----------\n")
			if !ok {
				t.Fatal("fixture has no ---------- separator")
			}
			want = strings.TrimSpace(want)
			got, err := adapt(caddyfile)
			if *update && strings.HasPrefix(want, "{") && err == nil {
				want = got
				if err := os.WriteFile(f, []byte(caddyfile+"\n----------\n"+got+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if strings.HasPrefix(want, "{") {
				if err != nil {
					t.Fatalf("adapt: %v", err)
				}
				wantJSON, err := canonical([]byte(want))
				if err != nil {
					t.Fatalf("fixture JSON: %v", err)
				}
				if got != wantJSON {
					t.Fatalf("adapted to\n%s\nwant\n%s", got, wantJSON)
				}
				return
			}
			if err == nil {
				t.Fatalf("adapted without error to\n%s\nwant error containing %q", got, want)
			}
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q\nwant it to contain %q", err, want)
			}
		})
	}
}

func adapt(caddyfile string) (string, error) {
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		return "", err
	}
	return canonical(out)
}

// canonical re-encodes JSON with sorted keys and indentation.
func canonical(b []byte) (string, error) {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return "", err
	}
	out, err := json.MarshalIndent(v, "", "\t")
	return string(out), err
}
