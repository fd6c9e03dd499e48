package caddyfile

import (
	"encoding/json"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/caddy-inflight/caddy-inflight/inflight"
)

// FuzzDirective feeds arbitrary directive text to the parser: it must never
// panic, and whatever it accepts must survive the JSON round trip Caddy
// puts it through.
func FuzzDirective(f *testing.F) {
	for _, seed := range []string{
		"inflight 20",
		"inflight {\n\tlimit tenant {tenant} {tenant_max}\n\ttotal 8\n\twait 60s\n\tpriority {header.X-Priority}\n}",
		"inflight 5 {\n\tstatus 503\n\tretry_after 1.5s\n\tdry_run\n\treplicas 3\n\tzone api\n}",
		"inflight {\n\tlimit a {client_ip} 1\n\tlimit a {client_ip} 1\n}",
		"inflight {\n\tmax_keys 10\n\tmetrics per_key plain\n\tlimit k \"{header.X}\\x00\" 9223372036854775807\n}",
		"inflight -1", "inflight {\n}", "inflight 1 2", "inflight {\n\tlimit\n}",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, input string) {
		tokens, err := caddyfile.Tokenize([]byte(input), "Caddyfile")
		if err != nil || len(tokens) == 0 || tokens[0].Text != "inflight" {
			return
		}
		h := httpcaddyfile.Helper{Dispenser: caddyfile.NewDispenser(tokens)}
		handler, err := parse(h)
		if err != nil {
			return
		}
		raw, err := json.Marshal(handler)
		if err != nil {
			t.Fatalf("accepted %q but cannot marshal it: %v", input, err)
		}
		var back inflight.Handler
		if err := json.Unmarshal(raw, &back); err != nil {
			t.Fatalf("accepted %q but its JSON %s does not load: %v", input, raw, err)
		}
	})
}
