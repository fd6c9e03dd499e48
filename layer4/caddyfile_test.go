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

// TestKeyPrefixRefused: a prefix length out of its family's range is
// refused with the same message in the Caddyfile, at its line, and in
// JSON; 0 is refused in the Caddyfile only (in JSON it is unset).
func TestKeyPrefixRefused(t *testing.T) {
	for _, tc := range []struct {
		args   string
		json   KeyPrefix // the same in JSON
		jsonOK bool
		want   string
	}{
		{"33", KeyPrefix{IPv4: 33}, false, `inflight: key_prefix ipv4 "33" is not allowed: want a prefix length 1-32`},
		{"-1", KeyPrefix{IPv4: -1}, false, `inflight: key_prefix ipv4 "-1" is not allowed: want a prefix length 1-32`},
		{"24 129", KeyPrefix{IPv4: 24, IPv6: 129}, false, `inflight: key_prefix ipv6 "129" is not allowed: want a prefix length 1-128`},
		{"24 0", KeyPrefix{IPv4: 24}, true, `inflight: key_prefix ipv6 "0" is not allowed: want a prefix length 1-128`},
		{"x", KeyPrefix{}, true, `inflight: key_prefix ipv4 "x" is not allowed: want a prefix length 1-32`},
	} {
		err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser("inflight 2 {\n\tkey_prefix " + tc.args + "\n}"))
		if err == nil || err.Error() != tc.want+", at Testfile:2" {
			t.Errorf("key_prefix %s: %v, want %s, at Testfile:2", tc.args, err, tc.want)
		}
		err = tc.json.check()
		switch {
		case tc.jsonOK && err != nil:
			t.Errorf("JSON %+v: %v, want it accepted", tc.json, err)
		case !tc.jsonOK && (err == nil || err.Error() != tc.want):
			t.Errorf("JSON %+v: %v, want %s", tc.json, err, tc.want)
		}
	}
}
