// Package sdk runs official LLM client SDKs, with their own retries,
// against a real Caddy with the module in this process, in front of a fake
// OpenAI-compatible backend. A nested module, so that the plugin's go.mod
// gains no dependency.
package sdk

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	_ "github.com/caddy-inflight/caddy-inflight"
	"github.com/caddy-inflight/caddy-inflight/internal/incaddy"
)

// globals: the admin API on the port ../harness_test.go uses: run the
// tests in a network namespace of their own beside those.
var globals = incaddy.Globals("127.0.0.1:2999", "")

// completion is a chat completion as the OpenAI API answers it.
const completion = `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`

// sdkRun is what a set of SDK clients saw: how long until the last
// finished, and how many HTTP requests they sent in all (retries
// included).
type sdkRun struct {
	took     time.Duration
	attempts int64
}

// runClients has clients openai-go clients, each making calls chat
// completions one after another against base, with the SDK's own retries
// (at most 50 each), and returns what they saw.
func runClients(t *testing.T, base string, clients, calls int) sdkRun {
	t.Helper()
	var attempts atomic.Int64
	hc := &http.Client{Transport: countingTransport{next: http.DefaultTransport, n: &attempts}}
	c := openai.NewClient(option.WithBaseURL(base), option.WithAPIKey("test"), option.WithMaxRetries(50), option.WithHTTPClient(hc))
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for range calls {
				_, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
					Model:    "m",
					Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
				})
				if err != nil {
					t.Errorf("chat completion: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	return sdkRun{took: time.Since(start), attempts: attempts.Load()}
}

type countingTransport struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// TestOpenAISDKRetryAfterMs: 12 openai-go clients, 5 chat completions
// each, against a model that answers in 100 ms behind `inflight 3` (no
// queue: refused at once). With whole-second Retry-After every refused
// client sleeps a second; with `retry_after_ms auto` each is told when a
// slot should be free for it, one after another. The clients finish
// sooner with the hints. They send more requests (retries included): a
// client told to come back when a slot frees finds it taken, most often,
// by the client that just gave it back and asks again at once; the hint
// reserves nothing (docs/waiting.md has the figures).
// The two sites run one after the other in the same Caddy, each in a zone
// of its own, the hint's first, so that any warm-up favours the other.
func TestOpenAISDKRetryAfterMs(t *testing.T) {
	model := incaddy.Serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(100 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, completion)
	}))
	addrs := [2]string{incaddy.FreeAddr(t), incaddy.FreeAddr(t)}
	options := [2]string{"\n\t\tretry_after_ms auto", ""}
	cfg := globals
	for i, addr := range addrs {
		cfg += fmt.Sprintf("http://%s {\n\tinflight 3 {\n\t\tzone sdk-%d%s\n\t}\n\treverse_proxy %s\n}\n", addr, i, options[i], model)
	}
	incaddy.Load(t, cfg)
	var runs [2]sdkRun
	for i, addr := range addrs {
		runs[i] = runClients(t, "http://"+addr+"/v1/", 12, 5)
	}
	hinted, whole := runs[0], runs[1]
	t.Logf("60 completions by 12 clients: with retry-after-ms auto %v and %d requests; with Retry-After 1 s %v and %d requests (ratio of times %.2f)",
		hinted.took.Round(time.Millisecond), hinted.attempts, whole.took.Round(time.Millisecond), whole.attempts, hinted.took.Seconds()/whole.took.Seconds())
	if hinted.took >= whole.took {
		t.Errorf("with retry-after-ms auto the clients took %v, with whole seconds %v: want sooner", hinted.took, whole.took)
	}
}
