package integration

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// replayMode is one `cost tokens` block to replay the trace through.
type replayMode struct {
	name       string
	costTokens string // the block's body; "" for the defaults
	// oneModel, if set, is the model every request of the trace names
	// instead of its own (a name as long, so that bodies keep their
	// sizes): the zone then learns one estimate of the models mixed.
	oneModel string
}

// replayModes are the estimates TestLLMReplay compares, on the same trace
// and the same cap: `fixed` is the default, 1024 output tokens for a
// request without max_tokens; `declared` an operator's guess at it, the
// chat output p90 of 420 tokens (as LiteLLM lets an admin declare the
// expected output), for requests without max_tokens only; `learned` is
// default_output auto.
var replayModes = []replayMode{
	{name: "fixed"},
	{name: "declared", costTokens: "default_output 420"},
	{name: "learned", costTokens: "default_output auto"},
}

// The replay: a cap of 64,000 tokens per mode, kept full by a closed loop
// of 150 clients a mode (each sends its next request when its last one
// has ended), so requests always queue. A warm-up of 200 requests gives a
// learned estimate some 140 reports (72 % of requests report their usage
// and give no max_tokens); 800 are measured after it. The trace has one
// more request per client, so that no client runs dry before the
// measured phase ends.
const (
	replaySeed     = 2023
	replayCap      = 64000
	replayClients  = 150
	replayWarmup   = 200
	replayMeasured = 800
)

// replayResult is what one mode's measured phase shows, and its whole
// run: the warm-up and the measured phase, from the first request sent
// to the last measured one's end (the trace's last requests, sent as
// clients run dry, are not counted).
type replayResult struct {
	reqPerSec  float64
	peak, mean float64 // real tokens in flight at the backend, × cap
	held       float64 // the zone's units held, sampled, × cap
	took       time.Duration

	wholeReqPerSec float64
	wholePeak      float64 // × cap
}

// TestLLMReplay replays production-shaped LLM traffic (llmTrace) through
// Caddy, once per replayModes, at the same cap, and compares the
// throughput each estimate gets from it and the real tokens in flight it
// lets reach the backend. With a learned estimate it asserts what
// learning is for: at least 1.3 times the requests a second of the fixed
// 1024, while the real tokens in flight stay within 1.1 times the cap,
// over the measured phase and over the whole run (where the conservative
// estimate from the 25th report serves). It logs the ratio to fixed over
// the whole run beside the measured phase's: what the warm-up costs.
func TestLLMReplay(t *testing.T) {
	trace := llmTrace(t, replaySeed, replayWarmup+replayMeasured+replayClients)
	results := replayResults(t, "llm-replay", replay(t, replayModes, trace))
	fixed := results["fixed"]
	for _, m := range replayModes {
		if m.name != "fixed" {
			warm, whole := results[m.name].reqPerSec/fixed.reqPerSec, results[m.name].wholeReqPerSec/fixed.wholeReqPerSec
			t.Logf("llm-replay %s/fixed req/s=%.2f warmed-up, %.2f whole-run (%.3f of it)", m.name, warm, whole, whole/warm)
		}
	}
	learned, ok := results["learned"]
	if !ok {
		return
	}
	scraped := scrapeAt(t, adminAddr)
	estimate := func(model string) float64 {
		return metricIn(t, scraped, "caddy_inflight_output_estimate_tokens", `zone="llm-learned"`, `model="`+model+`"`)
	}
	t.Logf("llm-replay learned output estimate: the zone's %v tokens, %s %v, %s %v", estimate(""),
		conversationShape.model, estimate(conversationShape.model), codeShape.model, estimate(codeShape.model))
	if learned.reqPerSec < 1.3*fixed.reqPerSec {
		t.Errorf("learned %.1f req/s, fixed %.1f: want at least 1.3 times", learned.reqPerSec, fixed.reqPerSec)
	}
	if learned.wholePeak > 1.1 {
		t.Errorf("learned: real tokens in flight peaked at %.2f×cap, want at most 1.1", learned.wholePeak)
	}
}

// replayRun is one mode's replay: its site, its fake model, its clients'
// progress and what its measured phase showed.
type replayRun struct {
	mode         replayMode
	trace        []traceRequest
	zone, url    string
	f            *fakeLLM
	next, done   atomic.Int64 // requests taken and completed
	failed       atomic.Int64
	firstFailure atomic.Value
	measuring    atomic.Bool

	// Written by the completion that begins or ends the measured phase,
	// read once every client has returned.
	began, start, end time.Time
	warmPeak, peak    int64
	mean              float64

	heldSum float64 // units held, summed over samples in the measured phase
	samples int
}

// replay sends the trace through one Caddy with a site per mode, each with
// its `cost tokens`, its own zone and cap and its own fake model, all at
// once: ambient load on the machine slows every mode alike, so their
// ratio is a verdict on the estimates, not on the moment each ran. Every
// response must be a 200, read to its end, and every zone and backend
// must hold nothing after.
func replay(t *testing.T, modes []replayMode, trace []traceRequest) []*replayRun {
	t.Helper()
	var caddyfile strings.Builder
	runs := make([]*replayRun, len(modes))
	for i, m := range modes {
		r := &replayRun{mode: m, trace: trace, zone: "llm-" + m.name, f: newFakeLLM(t)}
		if m.oneModel != "" {
			r.trace = namingOneModel(trace, m.oneModel)
		}
		port := freePort(t)
		r.url = fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
		costTokens := "cost tokens"
		if m.costTokens != "" {
			costTokens += " {\n\t\t\t" + m.costTokens + "\n\t\t}"
		}
		fmt.Fprintf(&caddyfile, `http://127.0.0.1:%d {
	inflight {
		total %d
		%s
		zone %s
		wait 60s
		max_waiting 2000
	}
	reverse_proxy %s {
		flush_interval -1
	}
}
`, port, replayCap, costTokens, r.zone, r.f.addr)
		runs[i] = r
	}
	load(t, caddyfile.String())

	var wg sync.WaitGroup
	for _, r := range runs {
		c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: replayClients, DisableCompression: true}, Timeout: 90 * time.Second}
		defer c.CloseIdleConnections()
		r.began = time.Now()
		for range replayClients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.client(c)
			}()
		}
	}
	finished := make(chan struct{})
	go func() {
		wg.Wait()
		close(finished)
	}()

	// Sample each zone's units held through its measured phase.
	for sampling := true; sampling; {
		select {
		case <-finished:
			sampling = false
		case <-time.After(200 * time.Millisecond):
			scraped := scrapeAt(t, adminAddr)
			for _, r := range runs {
				if r.measuring.Load() {
					r.heldSum += metricIn(t, scraped, "caddy_inflight_units", `zone="`+r.zone+`"`, `limit="total"`)
					r.samples++
				}
			}
		}
	}
	for _, r := range runs {
		if n := r.failed.Load(); n > 0 {
			t.Fatalf("%s: %d of %d requests failed, first: %v", r.mode.name, n, len(r.trace), r.firstFailure.Load())
		}
		eventually(t, r.mode.name+": the zone and the backend hold nothing", func() bool {
			return r.f.held.now() == 0 && metric(t, "caddy_inflight_units", `zone="`+r.zone+`"`) == 0
		})
	}
	return runs
}

// client sends the trace's next request until none is left. The
// completion that ends the warm-up begins the measured phase; the one
// that ends it reads the backend's gauge.
func (r *replayRun) client(c *http.Client) {
	for i := r.next.Add(1) - 1; i < int64(len(r.trace)); i = r.next.Add(1) - 1 {
		if err := replayOne(c, r.url, r.trace[i]); err != nil {
			r.failed.Add(1)
			r.firstFailure.CompareAndSwap(nil, err.Error())
		}
		switch r.done.Add(1) {
		case replayWarmup:
			r.warmPeak = r.f.held.restart()
			r.start = time.Now()
			r.measuring.Store(true)
		case replayWarmup + replayMeasured:
			r.measuring.Store(false)
			r.end = time.Now()
			r.peak, r.mean = r.f.held.read()
		}
	}
}

// replayResults logs each run's result, prefixed, and returns them by
// mode.
func replayResults(t *testing.T, prefix string, runs []*replayRun) map[string]replayResult {
	t.Helper()
	results := map[string]replayResult{}
	for _, r := range runs {
		res := r.result()
		t.Logf("%s mode=%s req/s=%.1f peak=%.2f×cap mean=%.2f×cap held=%.2f×cap took=%s whole-run: req/s=%.1f peak=%.2f×cap",
			prefix, r.mode.name, res.reqPerSec, res.peak, res.mean, res.held, res.took.Round(time.Millisecond), res.wholeReqPerSec, res.wholePeak)
		results[r.mode.name] = res
	}
	return results
}

// result is the run's measured phase, as fractions of the cap.
func (r *replayRun) result() replayResult {
	return replayResult{
		reqPerSec: replayMeasured / r.end.Sub(r.start).Seconds(),
		peak:      float64(r.peak) / replayCap,
		mean:      r.mean / replayCap,
		held:      r.heldSum / float64(max(r.samples, 1)) / replayCap,
		took:      r.end.Sub(r.began),

		wholeReqPerSec: (replayWarmup + replayMeasured) / r.end.Sub(r.began).Seconds(),
		wholePeak:      float64(max(r.warmPeak, r.peak)) / replayCap,
	}
}

// replayOne sends one request of the trace and reads its response to the
// end; anything but a 200 is an error.
func replayOne(c *http.Client, url string, r traceRequest) error {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(r.body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Fake-Output", strconv.Itoa(r.output))
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d: %.200s", resp.StatusCode, body)
	}
	return nil
}
