package redisstore

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestCaddyfileRefusesBadValues(t *testing.T) {
	for _, tc := range []struct{ block, want string }{
		{"db 1x", `db "1x" is not allowed: want a database number, 0 or more`},
		{"db -1", `db "-1" is not allowed: want a database number, 0 or more`},
		{"lease 0", `lease "0" is not allowed: want at least 1s`},
		{"timeout 0", `timeout "0" is not allowed: want a positive duration`},
		{"tls_client_auth cert.pem", `tls_client_auth ["cert.pem"]: want two arguments: the certificate and key files`},
		{"cluster yes", `cluster ["yes"]: want no argument`},
		{"address", `address []: want one or more addresses`},
		{"tls_cert x", `unknown option "tls_cert": want one of address, cluster, master_name, sentinel_username`},
	} {
		d := caddyfile.NewTestDispenser("redis {\n" + tc.block + "\n}")
		err := new(Store).UnmarshalCaddyfile(d)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to contain %q", tc.block, err, tc.want)
		}
	}
}

// An error about a wrong argument count does not show the arguments: a
// password among them stays hidden.
func TestCaddyfileErrorsDoNotShowPasswords(t *testing.T) {
	for _, opt := range []string{"password", "sentinel_password"} {
		d := caddyfile.NewTestDispenser("redis {\n" + opt + " s3cret-Pa55word extra\n}")
		err := new(Store).UnmarshalCaddyfile(d)
		want := opt + " has 2 arguments (not shown: a secret): want one argument"
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s with two arguments: error %v, want it to contain %q and not the password", opt, err, want)
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
		{Store{DB: 2, Cluster: true}, "db 2 is not allowed with a cluster: want 0"},
		{Store{DB: 1, Address: []string{"a:1", "b:2"}}, "db 1 is not allowed with a cluster"},
		{Store{SentinelPassword: "s"}, "sentinel_username and sentinel_password are not allowed without master_name"},
		{Store{SentinelUsername: "u", Cluster: true}, "not allowed without master_name"},
		{Store{Address: []string{"127.0.0.1"}}, `address "127.0.0.1" is not allowed: want host:port, such as 127.0.0.1:6379`},
		{Store{Address: []string{"a:1", "b:port"}}, `address "b:port" is not allowed`},
	} {
		s := tc.store
		s.OnError, s.Lease, s.Timeout = "open", 30e9, 1e9
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want it to contain %q", tc.store, err, tc.want)
		}
	}
}

// TestCaddyfileConnectionOptions: the connection options land in the
// store's JSON, and any tls_* option turns TLS on.
func TestCaddyfileConnectionOptions(t *testing.T) {
	for _, tc := range []struct{ block, want string }{
		{"address a:1 b:2\ncluster", `{"address":["a:1","b:2"],"cluster":true}`},
		{"master_name m\nsentinel_username su\nsentinel_password {env.SP}", `{"master_name":"m","sentinel_username":"su","sentinel_password":"{env.SP}"}`},
		{"tls", `{"tls":{}}`},
		{"tls_server_name r.test\ntls_ca ca.pem\ntls_client_auth c.pem k.pem", `{"tls":{"ca":"ca.pem","server_name":"r.test","client_certificate":"c.pem","client_key":"k.pem"}}`},
	} {
		var s Store
		if err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser("redis {\n" + tc.block + "\n}")); err != nil {
			t.Fatalf("%q: %v", tc.block, err)
		}
		if got, _ := json.Marshal(&s); string(got) != tc.want {
			t.Errorf("%q: %s, want %s", tc.block, got, tc.want)
		}
	}
}

// TestValidateAllowsADatabaseBehindSentinels: several addresses with
// master_name are sentinels, not a cluster: any db is allowed there.
func TestValidateAllowsADatabaseBehindSentinels(t *testing.T) {
	s := Store{DB: 3, Address: []string{"a:1", "b:2"}, MasterName: "m", OnError: "open", Lease: 30e9, Timeout: 1e9}
	if err := s.Validate(); err != nil {
		t.Fatalf("db 3 behind two sentinels: %v, want no error", err)
	}
}

// TestTLSPlaceholderThatIsEmptyIsRefused: tls_ca {env.X} with X unset
// would quietly mean the system's roots (and an unset client certificate,
// none): the config is refused instead, naming the option and what was
// written.
func TestTLSPlaceholderThatIsEmptyIsRefused(t *testing.T) {
	for _, tc := range []struct {
		tls  TLS
		want string
	}{
		{TLS{CA: "{env.INFLIGHT_TEST_UNSET_CA}"}, `tls ca "{env.INFLIGHT_TEST_UNSET_CA}" is empty once its placeholders are replaced`},
		{TLS{ClientCertificate: "{env.INFLIGHT_TEST_UNSET_C}", ClientKey: "k.pem"}, `tls client_certificate "{env.INFLIGHT_TEST_UNSET_C}" is empty`},
	} {
		if _, _, err := tc.tls.config(caddy.NewReplacer()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want it to contain %q", tc.tls, err, tc.want)
		}
	}
}
