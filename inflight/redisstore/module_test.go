package redisstore

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestCaddyfileRefusesBadValues(t *testing.T) {
	for _, tc := range []struct{ block, want string }{
		{"db 1x", `db "1x" is not allowed: want a database number, 0 or more`},
		{"db -1", `db "-1" is not allowed: want a database number, 0 or more`},
		{"lease 0", `lease "0" is not allowed: want at least 1s`},
		{"timeout 0", `timeout "0" is not allowed: want a positive duration`},
	} {
		d := caddyfile.NewTestDispenser("redis {\n" + tc.block + "\n}")
		err := new(Store).UnmarshalCaddyfile(d)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to contain %q", tc.block, err, tc.want)
		}
	}
}

func TestValidateRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		store Store
		want  string
	}{
		{Store{DB: -1}, "db -1 is not allowed"},
		{Store{KeyPrefix: "a}b"}, `key_prefix "a}b" is not allowed: want no '{' or '}'`},
		{Store{KeyPrefix: "{x"}, `key_prefix "{x" is not allowed`},
	} {
		s := tc.store
		s.OnError, s.Lease, s.Timeout = "open", 30e9, 1e9
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want it to contain %q", tc.store, err, tc.want)
		}
	}
}
