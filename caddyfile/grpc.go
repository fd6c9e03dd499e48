package caddyfile

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/caddy-inflight/caddy-inflight/inflight"
)

// grpcStatus reads `grpc_status resource_exhausted|unavailable`.
func grpcStatus(h httpcaddyfile.Helper) (string, error) {
	v, err := read.OneArg(h.Dispenser, "grpc_status", inflight.GRPCResourceExhausted+" or "+inflight.GRPCUnavailable)
	if err == nil && v == "" {
		v = "\"\"" // the empty string is the JSON default, not a name
	}
	if err == nil {
		if cerr := inflight.CheckGRPCStatus(v); cerr != nil {
			err = h.Errf("inflight: %v", cerr)
		}
	}
	return v, err
}
