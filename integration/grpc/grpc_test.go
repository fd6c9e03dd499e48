package grpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/caddy-inflight/caddy-inflight/internal/incaddy"
)

// refusedMessage is the grpc-message of a refusal by the limit `client`;
// an outage (grpc-go's "unexpected HTTP status code received from server")
// carries another.
const refusedMessage = "inflight: limit client refused the request (full)"

// site is a Caddy site that caps gRPC calls at one in flight (every call
// comes from 127.0.0.1) in front of backend b.
//
// request_buffers: Caddy v2.11.9's reverse_proxy wraps a request body it
// streams in bodyNopCloserIfNotRead, whose byte count the HTTP/2 transport
// writes while sending the body and reads, unsynchronised, when the
// backend resets the stream (grpc-go's server does once it has answered):
// a data race in Caddy that -race reported in 2 of 30 runs here. A body
// buffered whole (these calls' single request message) is not wrapped.
// Unary and server-streaming calls only: a buffer would hold back a
// client stream.
func site(address, tlsLine, option string, b *backend) string {
	if tlsLine != "" {
		tlsLine = "\t" + tlsLine + "\n"
	}
	return fmt.Sprintf("%s {\n%s\tinflight 1 {\n\t\t%s\n\t}\n\treverse_proxy h2c://%s {\n\t\tflush_interval -1\n\t\trequest_buffers 64KiB\n\t}\n}\n", address, tlsLine, option, b.addr)
}

func dial(t *testing.T, addr string, creds credentials.TransportCredentials, opts ...grpc.DialOption) grpc_health_v1.HealthClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(creds))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return grpc_health_v1.NewHealthClient(conn)
}

// TestGRPCRefusals: grpc-go's client, through Caddy's reverse_proxy to a
// gRPC server, over h2c and TLS, sees a call over the cap fail with
// RESOURCE_EXHAUSTED (UNAVAILABLE with grpc_status unavailable), the
// refusal's reason as its message and retry_after as its pushback; a
// server stream holds its slot while it streams and frees it when it ends
// or its client cancels it.
func TestGRPCRefusals(t *testing.T) {
	h2c, h2cUnavailable, h2cTLS := newBackend(t), newBackend(t), newBackend(t)
	certFile, keyFile, pool := selfSigned(t)
	a1, a2, a3 := incaddy.FreeAddr(t), incaddy.FreeAddr(t), incaddy.FreeAddr(t)
	load(t, site("http://"+a1, "", "retry_after 2500ms", h2c)+
		site("http://"+a2, "", "grpc_status unavailable", h2cUnavailable)+
		site("https://"+a3, "tls "+certFile+" "+keyFile, "grpc_status resource_exhausted", h2cTLS))

	for _, tc := range []struct {
		name     string
		addr     string
		creds    credentials.TransportCredentials
		b        *backend
		code     codes.Code
		pushback string
	}{
		{"h2c", a1, insecure.NewCredentials(), h2c, codes.ResourceExhausted, "2500"},
		{"h2c_unavailable", a2, insecure.NewCredentials(), h2cUnavailable, codes.Unavailable, "1000"},
		{"tls", a3, credentials.NewTLS(&tls.Config{RootCAs: pool}), h2cTLS, codes.ResourceExhausted, "1000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, tc.addr, tc.creds)
			ctx := t.Context()
			req := &grpc_health_v1.HealthCheckRequest{}

			// Under the cap: admitted, the backend answers.
			if _, err := c.Check(ctx, req); err != nil {
				t.Fatalf("Check under the cap: %v", err)
			}

			refused := func(what string, err error) {
				t.Helper()
				st, _ := status.FromError(err)
				if st.Code() != tc.code || st.Message() != refusedMessage {
					t.Fatalf("%s while a stream holds the slot: %v; want code %v, message %q", what, err, tc.code, refusedMessage)
				}
			}
			admittedOnceFree := func(what string) {
				t.Helper()
				eventually(t, what, func() bool {
					_, err := c.Check(ctx, req)
					if err != nil && status.Code(err) != tc.code {
						t.Fatalf("Check after %s: %v", what, err)
					}
					return err == nil
				})
			}

			// A server stream, admitted, holds the slot while it streams.
			held, err := c.Watch(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if m, err := held.Recv(); err != nil || m.Status != grpc_health_v1.HealthCheckResponse_SERVING {
				t.Fatalf("held stream's first message: %v, %v", m, err)
			}
			checks := tc.b.checks.Load()
			var trailer metadata.MD
			_, err = c.Check(ctx, req, grpc.Trailer(&trailer))
			refused("unary Check", err)
			if got := trailer.Get("grpc-retry-pushback-ms"); len(got) != 1 || got[0] != tc.pushback {
				t.Errorf("grpc-retry-pushback-ms %q, want %q", got, tc.pushback)
			}
			second, err := c.Watch(ctx, req)
			if err == nil {
				_, err = second.Recv()
			}
			refused("second Watch stream", err)
			if tc.name != "tls" {
				grpcWebRefused(t, "http://"+tc.addr, tc.code)
			}
			if n := tc.b.checks.Load(); n != checks {
				t.Fatalf("%d refused Check calls reached the backend", n-checks)
			}
			if n := tc.b.streams.Load(); n != 1 {
				t.Fatalf("%d streams open at the backend, want the held one only", n)
			}

			// The held stream is untouched by the refusals, and ends
			// normally when the backend ends it; its slot is then free.
			tc.b.release()
			if _, err := held.Recv(); err != io.EOF {
				t.Fatalf("held stream ended with %v, want io.EOF", err)
			}
			admittedOnceFree("the held stream ended")

			// A stream its client cancels frees its slot.
			sctx, cancel := context.WithCancel(ctx)
			defer cancel()
			held, err = c.Watch(sctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := held.Recv(); err != nil {
				t.Fatalf("second held stream: %v", err)
			}
			_, err = c.Check(ctx, req)
			refused("unary Check", err)
			cancel()
			if _, err := held.Recv(); status.Code(err) != codes.Canceled {
				t.Fatalf("cancelled stream ended with %v", err)
			}
			admittedOnceFree("the client cancelled its stream")
			eventually(t, "the backend saw the cancel", func() bool { return tc.b.streams.Load() == 0 })
		})
	}
}

// grpcWebRefused sends a gRPC-Web call over HTTP/1.1 (as a browser's
// grpc-web client does, through an Envoy-less Caddy) and checks its
// refusal: HTTP 200, the status in the headers, no body.
func grpcWebRefused(t *testing.T, base string, code codes.Code) {
	t.Helper()
	for _, ct := range []string{"application/grpc-web+proto", "application/grpc-web-text"} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/grpc.health.v1.Health/Check", strings.NewReader("AAAAAAA="))
		req.Header.Set("Content-Type", ct)
		req.Header.Set("X-Grpc-Web", "1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 1 || len(body) != 0 ||
			resp.Header.Get("Content-Type") != ct ||
			resp.Header.Get("Grpc-Status") != strconv.Itoa(int(code)) ||
			resp.Header.Get("Grpc-Message") != refusedMessage {
			t.Fatalf("gRPC-Web %s refusal: %s %d, headers %v, body %q", ct, resp.Proto, resp.StatusCode, resp.Header, body)
		}
	}
}

// attempts counts the attempts a client makes, retries included.
type attempts struct{ n atomic.Int64 }

func (a *attempts) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (a *attempts) HandleRPC(_ context.Context, s stats.RPCStats) {
	if b, ok := s.(*stats.Begin); ok && b.Client {
		a.n.Add(1)
	}
}
func (a *attempts) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (a *attempts) HandleConn(context.Context, stats.ConnStats)                       {}

// TestGRPCPushbackDrivesRetries: grpc-go retries a call only after a
// Trailers-Only response, and then waits grpc-retry-pushback-ms instead of
// its backoff. With a backoff of an hour and retry_after 1ms, a client
// whose retry policy allows three attempts makes all three within the
// call's deadline only if the refusal is Trailers-Only and its pushback is
// read.
func TestGRPCPushbackDrivesRetries(t *testing.T) {
	b := newBackend(t)
	addr := incaddy.FreeAddr(t)
	load(t, site("http://"+addr, "", "retry_after 1ms", b))
	const policy = `{"methodConfig": [{"name": [{"service": "grpc.health.v1.Health"}], "retryPolicy": {
		"maxAttempts": 3, "initialBackoff": "3600s", "maxBackoff": "3600s", "backoffMultiplier": 1,
		"retryableStatusCodes": ["RESOURCE_EXHAUSTED"]}}]}`
	var n attempts
	c := dial(t, addr, insecure.NewCredentials(), grpc.WithDefaultServiceConfig(policy), grpc.WithStatsHandler(&n))
	ctx := t.Context()
	req := &grpc_health_v1.HealthCheckRequest{}

	held, err := c.Watch(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := held.Recv(); err != nil {
		t.Fatal(err)
	}
	n.n.Store(0)
	cctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	_, err = c.Check(cctx, req)
	st, _ := status.FromError(err)
	if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), refusedMessage) {
		t.Fatalf("Check over the cap: %v; want RESOURCE_EXHAUSTED, %q", err, refusedMessage)
	}
	if got := n.n.Load(); got != 3 {
		t.Fatalf("%d attempts, want 3: the refusal is not Trailers-Only, or its pushback is not read", got)
	}
	if errors.Is(cctx.Err(), context.DeadlineExceeded) {
		t.Fatal("the call's deadline passed")
	}
}
