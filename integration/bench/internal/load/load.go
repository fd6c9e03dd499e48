// Package load sends HTTP requests to a loopback server from concurrent
// keep-alive workers, for a bounded time and count, and summarises what came
// back.
package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Options say what to send.
type Options struct {
	URL         string
	Workers     int
	Duration    time.Duration // no request starts after it
	MaxRequests int64         // no more requests than this are sent
	Timeout     time.Duration // per request
}

// Result is what a run measured. Requests counts every request sent, answered
// or not; Errors those that got no response; RPS responses per second.
type Result struct {
	Requests int64            `json:"requests"`
	Errors   int64            `json:"errors"`
	Seconds  float64          `json:"seconds"`
	RPS      float64          `json:"rps"`
	P50ms    float64          `json:"p50_ms"`
	P99ms    float64          `json:"p99_ms"`
	Status   map[string]int64 `json:"status"`
}

// CheckLoopback refuses a URL whose host is not a loopback IP literal
// (127.0.0.0/8 or ::1): this tool must never load anything but this machine.
func CheckLoopback(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return err
	}
	if u.Scheme != "http" {
		return fmt.Errorf("%s: only http:// URLs", rawURL)
	}
	if ip := net.ParseIP(u.Hostname()); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%s: host %q is not a loopback address (127.0.0.0/8, ::1)", rawURL, u.Hostname())
	}
	return nil
}

// Run sends requests until Duration has passed or MaxRequests were sent, and
// waits for the ones in flight.
func Run(ctx context.Context, o Options) (Result, error) {
	if err := CheckLoopback(o.URL); err != nil {
		return Result{}, err
	}
	if o.Workers < 1 || o.Duration <= 0 || o.MaxRequests < 1 || o.Timeout <= 0 {
		return Result{}, errors.New("workers, duration, max requests and timeout must be positive")
	}
	client := &http.Client{
		Transport: &http.Transport{
			MaxIdleConnsPerHost: o.Workers,
			DisableCompression:  true,
		},
		Timeout: o.Timeout,
		// A redirect could point anywhere: never follow one.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	defer client.CloseIdleConnections()

	var sent atomic.Int64
	workers := make([]stats, o.Workers)
	start := time.Now()
	end := start.Add(o.Duration)
	var wg sync.WaitGroup
	for i := range workers {
		s := &workers[i]
		s.status = make(map[int]int64)
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(end) && sent.Add(1) <= o.MaxRequests {
				s.do(ctx, client, o.URL)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	var total stats
	total.status = make(map[int]int64)
	for i := range workers {
		total.add(&workers[i])
	}
	res := Result{
		Requests: total.requests,
		Errors:   total.errors,
		Seconds:  elapsed.Seconds(),
		RPS:      float64(total.requests-total.errors) / elapsed.Seconds(),
		P50ms:    total.latency.quantile(0.50).Seconds() * 1e3,
		P99ms:    total.latency.quantile(0.99).Seconds() * 1e3,
		Status:   make(map[string]int64),
	}
	for code, n := range total.status {
		res.Status[strconv.Itoa(code)] = n
	}
	return res, nil
}

// stats are one worker's counts, merged at the end so workers share nothing.
type stats struct {
	requests, errors int64
	status           map[int]int64
	latency          histogram
}

func (s *stats) do(ctx context.Context, c *http.Client, url string) {
	s.requests++
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		s.errors++
		return
	}
	t0 := time.Now()
	resp, err := c.Do(req)
	if err == nil {
		// Read the body to the end so the connection is reused.
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if err != nil {
		s.errors++
		return
	}
	s.latency.record(time.Since(t0))
	s.status[resp.StatusCode]++
}

func (s *stats) add(o *stats) {
	s.requests += o.requests
	s.errors += o.errors
	for code, n := range o.status {
		s.status[code] += n
	}
	for i, n := range o.latency {
		s.latency[i] += n
	}
}

// histogram counts latencies in buckets 1% wide: fixed memory however many
// requests a run sends.
type histogram [histBuckets]int64

const (
	histGrowth  = 1.01
	histBuckets = 2600 // up to 1.01^2600 ns, about 3 minutes; longer goes in the last
)

var histLogGrowth = math.Log(histGrowth)

func (h *histogram) record(d time.Duration) {
	i := 0
	if d > 1 {
		i = min(int(math.Log(float64(d))/histLogGrowth), histBuckets-1)
	}
	h[i]++
}

// quantile returns the middle of the bucket holding quantile q.
func (h *histogram) quantile(q float64) time.Duration {
	var n int64
	for _, c := range h {
		n += c
	}
	if n == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(n)))
	var seen int64
	for i, c := range h {
		if seen += c; seen >= rank {
			return time.Duration(math.Pow(histGrowth, float64(i)+0.5))
		}
	}
	return 0
}
