// Package grpc checks inflight's refusals of gRPC calls with grpc-go's own
// client, through a real Caddy (in this process) whose reverse_proxy
// forwards to a real gRPC server, over h2c and over TLS, on loopback. A
// nested module, so that the plugin's go.mod gains no dependency.
package grpc

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health/grpc_health_v1"

	_ "github.com/caddy-inflight/caddy-inflight"
	"github.com/caddy-inflight/caddy-inflight/internal/incaddy"
)

// within bounds every wait on a condition; reaching it fails the test.
const within = 10 * time.Second

// globals: no admin endpoint (no fixed port); HTTP/2 with TLS and HTTP/2
// with prior knowledge (h2c), which gRPC clients speak in clear.
var globals = incaddy.Globals("off", "\tservers {\n\t\tprotocols h1 h2 h2c\n\t}\n")

// load runs a Caddyfile, after the test globals, until the test ends.
func load(t *testing.T, caddyfile string) { incaddy.Load(t, globals+caddyfile) }

// backend is a real gRPC server with the standard health service: Check
// (unary) answers SERVING; Watch (server-streaming) sends SERVING, then
// holds the stream open until its client leaves or release is called.
type backend struct {
	grpc_health_v1.UnimplementedHealthServer
	addr    string
	checks  atomic.Int64 // Check calls that reached the backend
	streams atomic.Int64 // Watch streams open now
	mu      sync.Mutex
	gate    chan struct{}
}

func newBackend(t *testing.T) *backend {
	t.Helper()
	b := &backend{gate: make(chan struct{})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	grpc_health_v1.RegisterHealthServer(srv, b)
	go srv.Serve(l)
	b.addr = l.Addr().String()
	t.Cleanup(srv.Stop)
	t.Cleanup(b.release) // runs first
	return b
}

func (b *backend) Check(context.Context, *grpc_health_v1.HealthCheckRequest) (*grpc_health_v1.HealthCheckResponse, error) {
	b.checks.Add(1)
	return &grpc_health_v1.HealthCheckResponse{Status: grpc_health_v1.HealthCheckResponse_SERVING}, nil
}

func (b *backend) Watch(_ *grpc_health_v1.HealthCheckRequest, s grpc_health_v1.Health_WatchServer) error {
	b.streams.Add(1)
	defer b.streams.Add(-1)
	b.mu.Lock()
	gate := b.gate
	b.mu.Unlock()
	if err := s.Send(&grpc_health_v1.HealthCheckResponse{Status: grpc_health_v1.HealthCheckResponse_SERVING}); err != nil {
		return err
	}
	select {
	case <-gate:
		return nil
	case <-s.Context().Done():
		return s.Context().Err()
	}
}

// release ends every held stream normally; later streams are held again.
func (b *backend) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.gate)
	b.gate = make(chan struct{})
}

// eventually polls cond until it holds, or fails the test after within.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key to dir, and
// returns their paths and a pool that trusts it.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, pool
}

func TestMain(m *testing.M) { incaddy.Main(m) }
