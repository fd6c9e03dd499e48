package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// How the store reaches a managed Redis: over TLS (with the operator's CA,
// a server name, a client certificate), through sentinels that require a
// password, and through one configuration endpoint of a cluster. Each case
// is served by a real Caddy config, and each is also run with the option
// left out, which must fail: the option is what makes it work.

// storeSite is a site whose inflight zones (one per name) keep their counts
// in Redis, refusing (on_error closed) whenever Redis cannot be reached:
// with a cap of 100 and one request at a time, a refusal is a store error.
func storeSite(t *testing.T, storeBlock string, zones ...string) string {
	t.Helper()
	port := freePort(t)
	var routes strings.Builder
	for _, z := range zones {
		fmt.Fprintf(&routes, `
	handle /%s {
		inflight {
			limit client {client_ip} 100
			zone %s
			store redis {
				%s
				on_error closed
				timeout 1s
			}
		}
		respond "ok"
	}`, z, z, storeBlock)
	}
	load(t, fmt.Sprintf("http://127.0.0.1:%d {%s\n}\n", port, routes.String()))
	return fmt.Sprintf("http://127.0.0.1:%d/", port)
}

// statuses requests each zone's path once and returns the statuses, by
// zone.
func statuses(url string, zones ...string) map[string]int {
	c := client("127.0.0.1")
	out := map[string]int{}
	for _, z := range zones {
		out[z] = get(context.Background(), c, url+z).status
	}
	return out
}

func allOK(got map[string]int) bool {
	for _, s := range got {
		if s != 200 {
			return false
		}
	}
	return true
}

// TestRedisOverTLS: a Redis that speaks only TLS, with a certificate for
// the name redis.test (not for its IP address) from the operator's own CA,
// and that requires client certificates. Only the whole set of tls options
// admits; each one left out refuses.
func TestRedisOverTLS(t *testing.T) {
	pki := newTestPKI(t)
	port := freePort(t)
	r := startRedisWith(t, port, tlsOnly(port, pki, "yes")...)
	full := fmt.Sprintf("address %s\n\t\t\t\ttls_ca %s\n\t\t\t\ttls_server_name redis.test\n\t\t\t\ttls_client_auth %s %s",
		r.addr, pki.ca, pki.clientCert, pki.clientKey)
	for _, tc := range []struct {
		name, block string
		want        int
	}{
		{"all tls options", full, 200},
		{"no tls", "address " + r.addr, 429},
		{"the system's roots, not the CA", strings.Replace(full, "tls_ca "+pki.ca, "tls", 1), 429},
		{"no server name", strings.Replace(full, "tls_server_name redis.test", "", 1), 429},
		{"no client certificate", strings.Replace(full, fmt.Sprintf("tls_client_auth %s %s", pki.clientCert, pki.clientKey), "", 1), 429},
	} {
		url := storeSite(t, tc.block, "tls")
		if got := statuses(url, "tls")["tls"]; got != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestRedisTLSNewCAOnReload: Redis gets a certificate from a new CA; the
// operator replaces the CA file and reloads the same config. The store
// connects with the new CA, although the config did not change: the
// reload does not keep the client made with the old one, and requests are
// admitted.
func TestRedisTLSNewCAOnReload(t *testing.T) {
	first, second := newTestPKI(t), newTestPKI(t)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	copyFile(t, first.ca, ca)
	port := freePort(t)
	r := startRedisWith(t, port, tlsOnly(port, first, "no")...)
	block := fmt.Sprintf("address %s\n\t\t\t\ttls_ca %s\n\t\t\t\ttls_server_name redis.test", r.addr, ca)
	if got := statuses(storeSite(t, block, "rot"), "rot")["rot"]; got != 200 {
		t.Fatalf("with the first CA: status %d, want 200", got)
	}
	r.stop()
	r.args = tlsOnly(port, second, "no")
	r.start(t)
	copyFile(t, second.ca, ca)
	if got := statuses(storeSite(t, block, "rot"), "rot")["rot"]; got != 200 {
		t.Fatalf("after the CA file was replaced and the config reloaded: status %d, want 200", got)
	}
}

// tlsOnly is the arguments of a redis-server that listens on port with TLS
// only, with pki's server certificate; authClients is yes or no.
func tlsOnly(port int, pki testPKI, authClients string) []string {
	return []string{"--port", "0", "--tls-port", strconv.Itoa(port),
		"--tls-cert-file", pki.serverCert, "--tls-key-file", pki.serverKey,
		"--tls-ca-cert-file", pki.ca, "--tls-auth-clients", authClients}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err == nil {
		err = os.WriteFile(to, b, 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestRedisTLSFilesRefused: a CA that is not there or not PEM, and a
// client certificate without its key, refuse the config with the option
// and the file named.
func TestRedisTLSFilesRefused(t *testing.T) {
	pki := newTestPKI(t)
	for _, tc := range []struct{ block, want string }{
		{"tls_ca /nonexistent/ca.pem", `tls ca "/nonexistent/ca.pem" is not allowed`},
		{"tls_ca " + pki.serverKey, "no PEM certificate in it"},
		{"tls_client_auth " + pki.clientCert + " " + pki.serverKey, "are not allowed"},
		{"tls_client_auth " + pki.clientCert, "tls_client_auth"},
		{"cluster\n\t\t\t\tmaster_name m", `cluster with master_name "m" is not allowed`},
	} {
		err := tryLoad(fmt.Sprintf(`http://127.0.0.1:%d {
	inflight {
		limit client {client_ip} 10
		store redis {
			address 127.0.0.1:1
			%s
		}
	}
	respond "ok"
}
`, freePort(t), tc.block))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to contain %q", tc.block, err, tc.want)
		}
	}
}

// TestRedisSentinelPassword: sentinels that require a password are reached
// with sentinel_password (and refuse the store without it).
func TestRedisSentinelPassword(t *testing.T) {
	master := startRedis(t)
	sentinel := startSentinel(t, master.port, "s3cret")
	block := "address " + sentinel + "\n\t\t\t\tmaster_name fleet"
	if got := statuses(storeSite(t, block+"\n\t\t\t\tsentinel_password s3cret", "s"), "s")["s"]; got != 200 {
		t.Errorf("with sentinel_password: status %d, want 200", got)
	}
	if got := statuses(storeSite(t, block, "s"), "s")["s"]; got != 429 {
		t.Errorf("without sentinel_password: status %d, want 429 (store error)", got)
	}
}

// TestRedisClusterConfigurationEndpoint: one node's address with `cluster`
// serves zones whose keys live on every node; without it, the zones whose
// slots are on other nodes fail (MOVED).
func TestRedisClusterConfigurationEndpoint(t *testing.T) {
	nodes := startRedisCluster(t)
	zones := []string{"z1", "z2", "z3", "z4", "z5", "z6", "z7", "z8"}
	with := statuses(storeSite(t, "address "+nodes[0].addr+"\n\t\t\t\tcluster", zones...), zones...)
	if !allOK(with) {
		t.Errorf("one address with cluster: %v, want 200 for every zone", with)
	}
	without := statuses(storeSite(t, "address "+nodes[0].addr, zones...), zones...)
	if allOK(without) {
		t.Errorf("one address without cluster: %v, want the zones on other nodes refused (the test needs zones on every node)", without)
	}
}

// startSentinel runs one sentinel watching the master at port as "fleet",
// requiring password.
func startSentinel(t *testing.T, masterPort int, password string) string {
	t.Helper()
	return runSentinel(t, fmt.Sprintf("requirepass %s\nsentinel monitor fleet 127.0.0.1 %d 1\n", password, masterPort))
}

// testPKI is a CA, a server certificate for redis.test only, and a client
// certificate, as PEM files.
type testPKI struct {
	ca, serverCert, serverKey, clientCert, clientKey string
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	write := func(name, kind string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey := newKey()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "inflight test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, usage x509.ExtKeyUsage, dns []string) ([]byte, []byte) {
		k := newKey()
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "inflight test"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, DNSNames: dns,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return der, keyDER
	}
	serverDER, serverKeyDER := issue(2, x509.ExtKeyUsageServerAuth, []string{"redis.test"})
	clientDER, clientKeyDER := issue(3, x509.ExtKeyUsageClientAuth, nil)
	return testPKI{
		ca:         write("ca.pem", "CERTIFICATE", caDER),
		serverCert: write("server.pem", "CERTIFICATE", serverDER),
		serverKey:  write("server-key.pem", "EC PRIVATE KEY", serverKeyDER),
		clientCert: write("client.pem", "CERTIFICATE", clientDER),
		clientKey:  write("client-key.pem", "EC PRIVATE KEY", clientKeyDER),
	}
}
