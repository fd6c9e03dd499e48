// Command loadgen loads an HTTP server on this machine from concurrent
// keep-alive workers for a fixed time and prints one line of JSON: requests,
// errors, seconds, rps, p50_ms, p99_ms and counts per status code.
//
//	go run ./loadgen -url http://127.0.0.1:8080/ -c 64 -d 10s
//
// It refuses any host that is not a loopback address.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/caddy-inflight/caddy-inflight/integration/bench/internal/load"
)

func main() {
	var o load.Options
	flag.StringVar(&o.URL, "url", "", "target, http://127.0.0.1:PORT/... or http://[::1]:PORT/...")
	flag.IntVar(&o.Workers, "c", 64, "concurrent workers, one keep-alive connection each")
	flag.DurationVar(&o.Duration, "d", 10*time.Second, "duration: no request starts after it")
	flag.Int64Var(&o.MaxRequests, "n", 100_000_000, "stop after this many requests")
	flag.DurationVar(&o.Timeout, "timeout", 10*time.Second, "per-request timeout")
	flag.Parse()

	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
}

func run(o load.Options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := load.Run(ctx, o)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}
