package grpc

import (
	"context"
	"crypto/tls"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/caddy-inflight/caddy-inflight/internal/incaddy"
)

// timeoutMessage is the grpc-message of a wait the call's deadline ended.
const timeoutMessage = "inflight: limit client refused the request (timeout)"

// callDeadline is the deadline of the calls that wait; margin is
// core.DeadlineMargin(callDeadline): their wait ends 450 ms in.
const (
	callDeadline = 500 * time.Millisecond
	margin       = 50 * time.Millisecond
)

// TestGRPCWaitEndsBeforeDeadline: a gRPC call that waits for a slot is
// answered before its deadline. With `wait 10s`, a unary Check whose
// client gives it 500 ms while a stream holds the only slot fails with
// RESOURCE_EXHAUSTED (the handler's refusal, reason timeout), not with
// the client's DEADLINE_EXCEEDED, in under 500 ms; it never reaches the
// backend; once the stream ends, a call is admitted again. With
// early_refusal, once the zone has seen a few releases and then none for a
// while, such a call is refused at arrival instead of waiting.
func TestGRPCWaitEndsBeforeDeadline(t *testing.T) {
	h2c, h2cEarly, h2cTLS := newBackend(t), newBackend(t), newBackend(t)
	certFile, keyFile, pool := selfSigned(t)
	a1, a2, a3 := incaddy.FreeAddr(t), incaddy.FreeAddr(t), incaddy.FreeAddr(t)
	load(t, site("http://"+a1, "", "wait 10s", h2c)+
		site("http://"+a2, "", "wait 10s\n\t\tearly_refusal", h2cEarly)+
		site("https://"+a3, "tls "+certFile+" "+keyFile, "wait 10s", h2cTLS))

	for _, tc := range []struct {
		name  string
		addr  string
		creds credentials.TransportCredentials
		b     *backend
		early bool
	}{
		{"h2c", a1, insecure.NewCredentials(), h2c, false},
		{"tls", a3, credentials.NewTLS(&tls.Config{RootCAs: pool}), h2cTLS, false},
		{"h2c_early_refusal", a2, insecure.NewCredentials(), h2cEarly, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, tc.addr, tc.creds)
			ctx := t.Context()
			req := &grpc_health_v1.HealthCheckRequest{}

			// Under the cap: admitted. With early_refusal, these give the
			// zone the releases its rate needs (4) before it predicts.
			for range 5 {
				if _, err := c.Check(ctx, req); err != nil {
					t.Fatalf("Check under the cap: %v", err)
				}
			}

			held, err := c.Watch(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if m, err := held.Recv(); err != nil || m.Status != grpc_health_v1.HealthCheckResponse_SERVING {
				t.Fatalf("held stream's first message: %v, %v", m, err)
			}
			if tc.early {
				// No release for a while: the zone's rate falls until a
				// slot looks further off than the call's 450 ms of wait.
				time.Sleep(2500 * time.Millisecond)
			}
			checks := tc.b.checks.Load()

			cctx, cancel := context.WithTimeout(ctx, callDeadline)
			start := time.Now()
			_, err = c.Check(cctx, req)
			took := time.Since(start)
			cancel()
			t.Logf("Check with a %s deadline while the slot is held: %v after %s", callDeadline, status.Code(err), took)
			if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || st.Message() != timeoutMessage {
				t.Fatalf("Check with a %s deadline while the slot is held: %v after %s; want code %v, message %q",
					callDeadline, err, took, codes.ResourceExhausted, timeoutMessage)
			}
			if took >= callDeadline {
				t.Fatalf("the refusal took %s, not before the call's %s deadline", took, callDeadline)
			}
			if tc.early && took >= callDeadline-margin {
				// The wait itself would have lasted 450 ms: a refusal
				// sooner was not a wait.
				t.Fatalf("early refusal took %s: the call waited", took)
			}
			if n := tc.b.checks.Load(); n != checks {
				t.Fatalf("%d refused Check calls reached the backend", n-checks)
			}

			// The held stream ends normally; its slot is free again and
			// nothing of the refused wait is left holding one.
			tc.b.release()
			if _, err := held.Recv(); err != io.EOF {
				t.Fatalf("held stream ended with %v, want io.EOF", err)
			}
			eventually(t, "the held stream ended", func() bool {
				cctx, cancel := context.WithTimeout(ctx, callDeadline)
				defer cancel()
				_, err := c.Check(cctx, req)
				if err != nil && status.Code(err) != codes.ResourceExhausted {
					t.Fatalf("Check after the held stream ended: %v", err)
				}
				return err == nil
			})
			if n := tc.b.streams.Load(); n != 0 {
				t.Fatalf("%d streams open at the backend after the release", n)
			}
		})
	}
}
