package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// openAIBackend answers as an OpenAI-compatible server does: a chat
// completions stream carries "usage":null in every chunk and ends with the
// usage chunk only when the request asked with stream_options.include_usage;
// a request that does not stream gets one JSON answer with its usage; any
// other path a JSON answer without one. X-Output is the output tokens
// reported. It records the bodies it was sent, by path.
type openAIBackend struct {
	mu     sync.Mutex
	bodies map[string][]string
}

func (b *openAIBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	b.mu.Lock()
	b.bodies[r.URL.Path] = append(b.bodies[r.URL.Path], string(body))
	b.mu.Unlock()
	var req struct {
		Stream        bool `json:"stream"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	out := r.Header.Get("X-Output")
	usage := `{"prompt_tokens":20,"completion_tokens":` + out + `,"total_tokens":27,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}`
	const head = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1743700245,"model":"gpt-4o-mini","system_fingerprint":"fp_b376dfbbd5",`
	switch {
	case r.URL.Path != "/v1/chat/completions":
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"resp_1","object":"response","status":"completed"}`)
	case !req.Stream:
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":`+usage+`}`)
	default:
		asked := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
		tail := "}\n\n"
		if asked {
			tail = `,"usage":null}` + "\n\n"
		}
		w.Header().Set("Content-Type", "text/event-stream")
		send := func(s string) {
			io.WriteString(w, s)
			w.(http.Flusher).Flush()
		}
		send(`data: ` + head + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]` + tail)
		for _, word := range []string{"Hello", " there", ", \\\"usage\\\":null"} {
			event := `data: ` + head + `"choices":[{"index":0,"delta":{"content":"` + word + `"},"logprobs":null,"finish_reason":null}]` + tail
			send(event[:len(event)/2]) // an event cut across writes
			send(event[len(event)/2:])
		}
		send(`data: ` + head + `"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]` + tail)
		if asked {
			send(`data: ` + head + `"choices":[],"usage":` + usage + "}\n\n")
		}
		send("data: [DONE]\n\n")
	}
}

// sent returns the bodies the backend was sent on path.
func (b *openAIBackend) sent(path string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.bodies[path]...)
}

// TestIncludeUsage: with include_usage, a chat completions stream that did
// not ask for its usage is asked for it, the usage counts, and the client
// gets byte for byte what the backend sends when not asked; a request that
// asked, one that does not stream and a Responses API request pass
// unchanged, both ways.
func TestIncludeUsage(t *testing.T) {
	b := &openAIBackend{bodies: map[string][]string{}}
	backend := serveAt(t, "127.0.0.1:0", b)
	port := freePort(t)
	const zone = "include-usage"
	load(t, fmt.Sprintf(`http://127.0.0.1:%d {
	inflight {
		total 100000
		cost tokens {
			include_usage
		}
		zone %s
	}
	reverse_proxy %s {
		flush_interval -1
	}
}
`, port, zone, backend))

	ask := func(base, path, body, output string) string {
		t.Helper()
		r := post(context.Background(), http.DefaultClient, base+path, body, "Content-Type", "application/json", "X-Output", output)
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("%s: %d, %v: %s", path, r.status, r.err, r.body)
		}
		return r.body
	}
	caddy, direct := fmt.Sprintf("http://127.0.0.1:%d", port), "http://"+backend

	const (
		stream    = `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		asking    = `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
		notStream = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
		responses = `{"model":"gpt-4o-mini","stream":true,"input":"hi"}`
	)
	for _, c := range []struct {
		name, path, body, output string
		sentAs                   string // the body the backend gets through Caddy
		reported                 bool   // the client sees the usage
	}{
		{"stream without stream_options", "/v1/chat/completions", stream, "7", `{"stream_options":{"include_usage":true},` + stream[1:], false},
		{"stream asking for usage", "/v1/chat/completions", asking, "11", asking, true},
		{"not streamed", "/v1/chat/completions", notStream, "13", notStream, true},
		{"responses API", "/v1/responses", responses, "17", responses, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := ask(direct, c.path, c.body, c.output) // what the client would get without Caddy
			got := ask(caddy, c.path, c.body, c.output)
			if got != want {
				t.Errorf("through Caddy the client got\n%s\nthe backend answers it directly with\n%s", got, want)
			}
			if has := strings.Contains(got, `"completion_tokens":`+c.output); has != c.reported {
				t.Errorf("usage in the client's answer: %v, want %v:\n%s", has, c.reported, got)
			}
			sent := b.sent(c.path)
			if len(sent) != 2 || sent[0] != c.body || sent[1] != c.sentAs {
				t.Errorf("the backend was sent %q, want %q through Caddy", sent[len(sent)-1], c.sentAs)
			}
			b.mu.Lock()
			b.bodies[c.path] = nil
			b.mu.Unlock()
		})
	}
	if !strings.Contains(ask(direct, "/v1/chat/completions", `{"stream_options":{"include_usage":true},`+stream[1:], "7"), `"usage":null`) {
		t.Fatal("the backend does not write usage:null when asked: the test tests nothing")
	}

	for kind, n := range map[string]float64{"input": 3 * 20, "output": 7 + 11 + 13} {
		eventually(t, fmt.Sprintf("%v %s tokens reported", n, kind), func() bool {
			return metric(t, "caddy_inflight_reported_tokens_total", `zone="`+zone+`"`, `kind="`+kind+`"`) == n
		})
	}
}
