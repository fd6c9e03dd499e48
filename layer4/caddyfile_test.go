package layer4

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// TestRemoteAddrKeyRefused: a key with the client's port makes every
// connection a key of its own, so the limit would never act: the
// Caddyfile is refused at the key's line, and so is the JSON.
func TestRemoteAddrKeyRefused(t *testing.T) {
	for _, key := range []string{"{l4.conn.remote_addr}", "{l4.tls.server_name}/{l4.conn.remote_addr}"} {
		d := caddyfile.NewTestDispenser("inflight {\n\tzone db\n\tlimit conn " + key + " 2\n}")
		err := new(Handler).UnmarshalCaddyfile(d)
		if err == nil || !strings.Contains(err.Error(), "Testfile:3") || !strings.Contains(err.Error(), "want {l4.conn.remote_ip}") {
			t.Errorf("key %s: %v, want a refusal at Testfile:3 pointing to {l4.conn.remote_ip}", key, err)
		}
		if err := checkKey(key); err == nil {
			t.Errorf("key %s: accepted in JSON", key)
		}
	}
	for _, key := range []string{RemoteIP, "{l4.tls.server_name}"} {
		if err := checkKey(key); err != nil {
			t.Errorf("key %s: %v", key, err)
		}
	}
}
