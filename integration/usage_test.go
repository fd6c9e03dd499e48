package integration

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// usageBackend answers as model APIs do, with the usage they report: the
// path picks the shape, X-Output the output tokens reported.
func usageBackend(t *testing.T) string {
	return serveAt(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		out := r.Header.Get("X-Output")
		if out == "" {
			out = "7"
		}
		sse := func(events ...string) {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, e := range events {
				io.WriteString(w, e)
				w.(http.Flusher).Flush()
			}
		}
		switch r.URL.Path {
		case "/openai":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion","created":1741570283,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":"The \"usage\":{\"completion_tokens\":999} is text.","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":1117,"completion_tokens":%s,"total_tokens":1163,"prompt_tokens_details":{"cached_tokens":1024,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default","system_fingerprint":"fp_fc9f1d7035"}`, out)
		case "/openai-stream":
			sse(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":null}`+"\n\n",
				`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}],"usage":null}`+"\n\n",
				`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":`+out+`,"total_tokens":27,"prompt_tokens_details":{"cached_tokens":0}}}`+"\n\n",
				"data: [DONE]\n\n")
		case "/anthropic":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"msg_013Zva2CMHLNnXjNJJKqJ2EF","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Hi!"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":2095,"cache_creation_input_tokens":0,"cache_read_input_tokens":2000,"output_tokens":%s}}`, out)
		case "/anthropic-stream", "/anthropic-cut":
			events := []string{
				"event: message_start\n" + `data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":5,"cache_read_input_tokens":0,"output_tokens":1}}}` + "\n\n",
				"event: content_block_start\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\n\n",
				"event: content_block_delta\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}` + "\n\n",
			}
			if r.URL.Path == "/anthropic-cut" {
				sse(events...)
				panic(http.ErrAbortHandler) // the model's connection breaks mid-stream
			}
			sse(append(events,
				"event: content_block_stop\n"+`data: {"type":"content_block_stop","index":0}`+"\n\n",
				"event: message_delta\n"+`data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":`+out+`}}`+"\n\n",
				"event: message_stop\n"+`data: {"type":"message_stop"}`+"\n\n")...)
		default:
			http.NotFound(w, r)
		}
	}))
}

// TestTokenUsageReported: the usage OpenAI- and Anthropic-shaped backends
// report, whole and streamed, reaches the access log's placeholders and
// the metrics, with nothing read from a stream cut short nor from text a
// client can make a model write; the learned output estimate, the zone's
// and its one model's, is the 90th percentile from the 100th report, and
// the next request is estimated with it.
func TestTokenUsageReported(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			storeBlock := ""
			if store == "redis" {
				storeBlock = fmt.Sprintf("store redis {\n\t\t\taddress %s\n\t\t}", startRedis(t).addr)
			}
			zone := "usage-" + store
			backend := usageBackend(t)
			port := freePort(t)
			logFile := filepath.Join(t.TempDir(), "access.log")
			config := fmt.Sprintf(`http://127.0.0.1:%d {
	log {
		output file %s
		format json
	}
	log_append input {http.inflight.usage.input_tokens}
	log_append output {http.inflight.usage.output_tokens}
	log_append cached {http.inflight.usage.cached_tokens}
	log_append cost {http.inflight.cost}
	inflight {
		total 100000
		cost tokens {
			default_output auto 2000
		}
		zone %s
		%s
	}
	reverse_proxy %s {
		flush_interval -1
	}
}
`, port, logFile, zone, storeBlock, backend)
			load(t, config)
			url := fmt.Sprintf("http://127.0.0.1:%d", port)
			body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}` // 57 bytes: 15 tokens
			ask := func(method, path, output string) {
				t.Helper()
				r := send(context.Background(), http.DefaultClient, method, url+path, body, "X-Output", output)
				if r.err != nil && path != "/anthropic-cut" { // that stream breaks, as the backend's did
					t.Fatal(r.err)
				}
			}
			post := func(path, output string) { t.Helper(); ask("POST", path, output) }
			post("/openai", "46")
			post("/openai-stream", "7")
			post("/anthropic", "503")
			post("/anthropic-stream", "15")
			post("/anthropic-cut", "15")
			ask("GET", "/openai", "1") // as a file a client uploaded could read: no model's report
			want := []map[string]string{
				{"input": "1117", "output": "46", "cached": "1024", "cost": "2015"},
				{"input": "20", "output": "7", "cached": "0", "cost": "2015"},
				{"input": "4095", "output": "503", "cached": "2000", "cost": "2015"},
				{"input": "30", "output": "15", "cached": "0", "cost": "2015"},
				{}, // reverse_proxy re-panics the broken copy: log_append adds nothing
				{"input": "", "output": "", "cached": "", "cost": "2015"},
			}
			eventually(t, "six access log lines", func() bool { return len(accessLines(t, logFile)) == 6 })
			for i, line := range accessLines(t, logFile) {
				for k, v := range want[i] {
					if got := line[k]; fmt.Sprint(got) != v && !(v == "" && got == nil) {
						t.Errorf("request %d (%v): log field %s = %v, want %q", i, line["request"].(map[string]any)["uri"], k, got, v)
					}
				}
			}
			for kind, n := range map[string]float64{"input": 1117 + 20 + 4095 + 30, "cached": 1024 + 2000, "output": 46 + 7 + 503 + 15} {
				if got := metric(t, "caddy_inflight_reported_tokens_total", `zone="`+zone+`"`, `kind="`+kind+`"`); got != n {
					t.Errorf("caddy_inflight_reported_tokens_total{kind=%q} = %v, want %v", kind, got, n)
				}
			}
			if got := metric(t, "caddy_inflight_usage_ratio_count", `zone="`+zone+`"`); got != 4 {
				t.Errorf("caddy_inflight_usage_ratio_count = %v, want 4 (the cut stream and the GET report nothing)", got)
			}
			if got := metric(t, "caddy_inflight_output_estimate_tokens", `zone="`+zone+`"`); got != 2000 {
				t.Errorf("output estimate before 25 reports: %v, want default_output 2000, and no model's series", got)
			}

			// 96 more reports of 1..96 output tokens: 100 in all (46, 7,
			// 503, 15 and 1..96), whose 90th percentile is 87.
			for i := 1; i <= 96; i++ {
				post("/openai", fmt.Sprint(i))
			}
			// The last report is counted as its handler returns, which may
			// be just after its client read the answer: waited for.
			eventually(t, "the 100th report counted", func() bool {
				return metric(t, "caddy_inflight_usage_ratio_count", `zone="`+zone+`"`) == 100
			})
			for _, model := range []string{"", "m"} { // the zone's, and the model's: every request names m
				if got := metric(t, "caddy_inflight_output_estimate_tokens", `zone="`+zone+`"`, `model="`+model+`"`); got != 87 {
					t.Errorf("output estimate of model %q after 100 reports: %v, want their 90th percentile, 87", model, got)
				}
			}
			var state struct {
				Zones []struct {
					Zone  string
					Usage struct{ Models []map[string]any }
				}
			}
			if err := json.Unmarshal([]byte(adminGet(t, "/inflight/")), &state); err != nil {
				t.Fatal(err)
			}
			models := "no zone " + zone
			for _, z := range state.Zones {
				if z.Zone == zone {
					models = fmt.Sprint(z.Usage.Models)
				}
			}
			if want := `[map[learned:true model:m output_estimate:87 reports:100]]`; models != want {
				t.Errorf("GET /inflight/: usage.models %s, want %s", models, want)
			}
			post("/openai", "1")
			lines := accessLines(t, logFile)
			if got := lines[len(lines)-1]["cost"]; fmt.Sprint(got) != "102" {
				t.Errorf("cost of a request naming no max_tokens once learnt: %v, want 15 + 87 = 102", got)
			}

			// A reload keeps the zone, and what it learnt.
			reloaded := strings.Replace(config, "total 100000", "total 90000", 1)
			load(t, reloaded)
			if got := metric(t, "caddy_inflight_output_estimate_tokens", `zone="`+zone+`"`, `model="m"`); got != 87 {
				t.Errorf("output estimate after a reload: %v, want 87 as learnt", got)
			}
			eventually(t, "no unit held once every request ended", func() bool {
				return metric(t, "caddy_inflight_units", `zone="`+zone+`"`, `limit="total"`) == 0
			})
		})
	}
}

// accessLines reads the JSON access log lines of file.
func accessLines(t *testing.T, file string) []map[string]any {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		return nil
	}
	defer f.Close()
	var lines []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["request"] != nil {
			lines = append(lines, m)
		}
	}
	return lines
}

// TestTokenUsageCompressed: usage is read from the answer before anything
// compresses it. A client asking for gzip gets gzip, and the usage is
// read, when the site compresses toward clients with `encode` ordered
// outside inflight (`order inflight after encode`), and the client's
// Accept-Encoding is not passed to a backend that would compress
// (`header_up -Accept-Encoding`); with the client's Accept-Encoding passed
// on, the gzip answer passes unread.
func TestTokenUsageCompressed(t *testing.T) {
	backend := serveAt(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		// Longer than encode's minimum_length (512 bytes).
		answer := `{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("lorem ipsum ", 60) + `"}}],"usage":{"prompt_tokens":11,"completion_tokens":22}}`
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			gz := gzip.NewWriter(w)
			io.WriteString(gz, answer)
			gz.Close()
			return
		}
		io.WriteString(w, answer)
	}))
	port := freePort(t)
	loadWith(t, "order inflight after encode", fmt.Sprintf(`http://127.0.0.1:%d {
	encode gzip
	inflight {
		total 100000
		cost tokens
		zone compressed
	}
	reverse_proxy /passed %s
	reverse_proxy %s {
		header_up -Accept-Encoding
	}
}
`, port, backend, backend))
	for _, c := range []struct {
		path string
		want float64 // output tokens counted so far
	}{{"/", 22}, {"/passed", 22}} {
		req, _ := http.NewRequest("POST", fmt.Sprintf("http://127.0.0.1:%d%s", port, c.path), strings.NewReader("{}"))
		req.Header.Set("Accept-Encoding", "gzip")
		resp, err := (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if ce := resp.Header.Get("Content-Encoding"); ce != "gzip" {
			t.Errorf("%s: Content-Encoding %q, want gzip for a client asking for it", c.path, ce)
		}
		// Counted as the handler returns, maybe just after the client
		// read the answer, and before it gives its units back.
		eventually(t, "the request gave its units back", func() bool {
			return metric(t, "caddy_inflight_units", `zone="compressed"`, `limit="total"`) == 0
		})
		if got := metric(t, "caddy_inflight_reported_tokens_total", `zone="compressed"`, `kind="output"`); got != c.want {
			t.Errorf("after %s: output tokens counted %v, want %v", c.path, got, c.want)
		}
	}
}

// TestDryRunReportsUsageOfWhatItLetThrough: with dry_run, requests over the
// cap are let through holding nothing; the usage their responses report is
// counted all the same, and each is answered in full (the report of a
// request that holds no units settles nothing).
func TestDryRunReportsUsageOfWhatItLetThrough(t *testing.T) {
	llm := newFakeLLM(t)
	port := freePort(t)
	const zone = "dry-run-usage"
	load(t, fmt.Sprintf(`http://127.0.0.1:%d {
	inflight {
		total 100
		cost tokens {
			default_output 80
		}
		zone %s
		dry_run
	}
	reverse_proxy %s
}
`, port, zone, llm.addr))
	// Each counts 95 of the 100 (15 tokens in, 80 out): while the first
	// runs (2 s), the others are over the cap.
	const n, output, first = 4, 64, 500
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	results := make(chan result, n)
	post := func(output int) {
		results <- send(context.Background(), http.DefaultClient, "POST", url, body, "X-Fake-Output", fmt.Sprint(output))
	}
	go post(first)
	eventually(t, "the first request at the backend", func() bool { return llm.held.now() > 0 })
	for range n - 1 {
		go post(output)
	}
	for range n {
		if r := <-results; r.err != nil || r.status != http.StatusOK || !strings.Contains(r.body, `"completion_tokens":`) {
			t.Fatalf("a request under dry_run: status %d, error %v, body %.80q; want 200 and the whole response", r.status, r.err, r.body)
		}
	}
	if got := metric(t, "caddy_inflight_rejected_total", `zone="`+zone+`"`, `reason="dry_run"`); got != n-1 {
		t.Fatalf("caddy_inflight_rejected_total{reason=dry_run} = %v, want %d (every request after the first)", got, n-1)
	}
	if got, want := metric(t, "caddy_inflight_reported_tokens_total", `zone="`+zone+`"`, `kind="output"`), first+(n-1)*output; got != float64(want) {
		t.Fatalf("output tokens reported: %v, want %d (every request's, let through or not)", got, want)
	}
}
