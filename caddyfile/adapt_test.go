package caddyfile

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/caddy-inflight/caddy-inflight/caddyfile/options"
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
			got, warnings, err := adaptWarned(caddyfile)
			if len(warnings) > 0 {
				t.Errorf("adapt warned: %q", warnings)
			}
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

// adaptWarned adapts a Caddyfile, and returns the warnings of the
// directives as `caddy adapt` shows them (file:line: message).
func adaptWarned(caddyfile string) (string, []string, error) {
	var warnings []string
	defer func(report func(caddyconfig.Warning)) { adaptWarning = report }(adaptWarning)
	adaptWarning = func(w caddyconfig.Warning) { warnings = append(warnings, w.String()) }
	got, err := adapt(caddyfile)
	return got, warnings, err
}

// TestAdaptWarns: a setting that adapts but is likely a mistake is warned
// of at its file and line, once: a literal Redis password (the adapted
// config, and so Caddy's GET /config/, shows it), a fixed deadline that
// cuts the wait, and a setting that has no effect. A placeholder password
// or a deadline that resolves per request is not.
func TestAdaptWarns(t *testing.T) {
	for _, tc := range []struct{ name, block, want string }{
		{"literal password", "\t\tstore redis {\n\t\t\taddress 127.0.0.1:6379\n\t\t\tpassword s3cret\n\t\t}\n",
			"Caddyfile:5: inflight: store redis: password is written literally: Caddy's GET /config/ shows it to whoever reaches the admin API; write it as a placeholder such as {env.REDIS_PASSWORD} and set that variable"},
		{"literal sentinel password", "\t\tstore redis {\n\t\t\taddress 127.0.0.1:26379\n\t\t\tmaster_name m\n\t\t\tsentinel_password s3cret\n\t\t}\n",
			"Caddyfile:6: inflight: store redis: sentinel_password is written literally"},
		{"placeholder password", "\t\tstore redis {\n\t\t\taddress 127.0.0.1:6379\n\t\t\tpassword {env.REDIS_PASSWORD}\n\t\t}\n", ""},
		{"fixed deadline below wait", "\t\twait 30s\n\t\tdeadline 300ms\n",
			"Caddyfile:4: inflight: deadline cuts the wait: a fixed deadline of 300ms ends every wait within 270ms (the deadline less its margin), not wait 30s: lower wait instead, or give a placeholder that resolves per request, such as {header.X-Request-Timeout}"},
		{"fixed deadline above wait", "\t\twait 1s\n\t\tdeadline 5s\n", ""},
		{"deadline per request", "\t\twait 30s\n\t\tdeadline {header.X-Request-Timeout}\n", ""},
		{"deadline without wait", "\t\tdeadline {header.X-Request-Timeout}\n",
			"Caddyfile:3: inflight: deadline has no effect: requests never wait without wait"},
		{"max_waiting without wait", "\t\tmax_waiting 5\n", "Caddyfile:3: inflight: max_waiting has no effect: units never wait without wait"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, warnings, err := adaptWarned(":8080 {\n\tinflight 5 {\n" + tc.block + "\t}\n}\n")
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.want == "" && len(warnings) > 0:
				t.Fatalf("adapt warned %q, want no warning", warnings)
			case tc.want != "" && (len(warnings) != 1 || !strings.HasPrefix(warnings[0], tc.want)):
				t.Fatalf("adapt warned %q, want one warning starting %q", warnings, tc.want)
			}
			for _, w := range warnings {
				if strings.Contains(w, "s3cret") {
					t.Fatalf("the warning shows the password: %s", w)
				}
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

// TestSubdirectivesNameTheSharedOptions: the list of options in the HTTP
// directive's refusals names every option every protocol shares.
func TestSubdirectivesNameTheSharedOptions(t *testing.T) {
	listed := strings.Split(subdirectives, ", ")
	for _, opt := range options.Shared {
		if !slices.Contains(listed, opt) {
			t.Errorf("subdirectives %q lacks %s", subdirectives, opt)
		}
	}
}
