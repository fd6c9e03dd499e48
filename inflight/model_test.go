package inflight

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
	"github.com/caddy-inflight/caddy-inflight/inflight/internal/bodytest"
	"github.com/caddy-inflight/caddy-inflight/inflight/llm"
)

// TestModelReadOnlyWhenNamed: a handler whose templates do not name
// {http.inflight.model}, without cost tokens, does not read the body
// before the next handler; one whose limit key names it reads it (up to
// 1 MiB without cost tokens), sets the placeholder, and hands the body on
// byte for byte. A body over the bound has the model _unknown.
func TestModelReadOnlyWhenNamed(t *testing.T) {
	body := []byte(`{"messages":[{"role":"user","content":"hi"}],"model":"model-a"}`)
	for _, c := range []struct {
		name     string
		key      string
		body     []byte
		readsAny bool
		model    string
	}{
		{"not named", DefaultKey, body, false, ""},
		{"named by a key", "{http.inflight.model}", body, true, "model-a"},
		{"named within a key", "{http.vars.client_ip}/{http.inflight.model}", body, true, "model-a"},
		{"over 1 MiB", "{http.inflight.model}", append(bytes.Repeat([]byte(" "), llm.DefaultMaxBody), body...), true, llm.UnknownModel},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := provisioned(t, &Handler{Config: core.Config{Zone: "model-read-" + strings.ReplaceAll(c.name, " ", "-"), Limits: []core.Limit{{Name: "model", Key: c.key, Max: core.Max{Fixed: 2}}}}})
			r, repl := request("198.51.100.7:5555")
			r.Method = http.MethodPost
			counted := &bodytest.Counting{R: bytes.NewReader(c.body)}
			r.Body, r.ContentLength = io.NopCloser(counted), int64(len(c.body))
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				if readBefore := counted.N > 0; readBefore != c.readsAny {
					t.Errorf("body read before the next handler: %v, want %v", readBefore, c.readsAny)
				}
				if got, _ := repl.GetString("http.inflight.model"); got != c.model {
					t.Errorf("{http.inflight.model} = %q, want %q", got, c.model)
				}
				got, err := io.ReadAll(r.Body)
				if err != nil || !bytes.Equal(got, c.body) {
					t.Errorf("the next handler read %d bytes (%v), want the %d sent", len(got), err, len(c.body))
				}
				return nil
			})
			if err := h.ServeHTTP(&discardWriter{}, r, next); err != nil {
				t.Fatal(err)
			}
		})
	}
}
