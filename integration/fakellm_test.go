package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The fake model's speed. Tokens come in batches, one sleep, one chunk
// and one flush a batch, so that the backend sleeps rather than spins.
// The pace is slow enough that a replay takes half a core under -race
// (some 7 ms of CPU a request, most of it the race detector's), so that
// the model's pace, not a busy machine's CPU, sets the throughput: at
// 1 ms a token the same comparison read anything from 0.87 to 1.62 on two
// busy cores, at 4 ms it reads what Little's law predicts.
const (
	fakeTokenPace = 4 * time.Millisecond // per output token
	fakeBatch     = 16                   // output tokens a sleep
	fakePrefill   = 100_000              // prompt tokens a second
)

// fakeLLM is an OpenAI-compatible chat-completions backend of unlimited
// capacity that measures what a cap in front of it lets through: the real
// tokens in flight, each request holding its prompt and the output it has
// produced so far from when it starts until its response ends.
type fakeLLM struct {
	addr string
	held tokenGauge
}

func newFakeLLM(t testing.TB) *fakeLLM {
	t.Helper()
	f := &fakeLLM{}
	f.held.restart()
	f.addr = serveAt(t, "127.0.0.1:0", f)
	return f
}

// tokenGauge is the tokens in flight, their peak and their time-weighted
// mean since restart. A mutex, not atomics: the mean integrates the count
// over time, which needs the count and the time of its last change
// together; some thousands of changes a second cost nothing.
type tokenGauge struct {
	mu          sync.Mutex
	cur, peak   int64
	area        float64 // token-seconds since start
	start, last time.Time
}

func (g *tokenGauge) add(n int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.advance(time.Now())
	g.cur += n
	g.peak = max(g.peak, g.cur)
}

func (g *tokenGauge) advance(now time.Time) {
	g.area += float64(g.cur) * now.Sub(g.last).Seconds()
	g.last = now
}

// restart forgets the peak and the mean so far, and returns that peak: a
// measured phase begins.
func (g *tokenGauge) restart() (peak int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	peak = g.peak
	g.start, g.last, g.area, g.peak = time.Now(), time.Now(), 0, g.cur
	return peak
}

// now returns the tokens in flight.
func (g *tokenGauge) now() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cur
}

// read returns the peak and the time-weighted mean since restart.
func (g *tokenGauge) read() (peak int64, mean float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	g.advance(now)
	return g.peak, g.area / now.Sub(g.start).Seconds()
}

// fakeRequest is what the fake model reads of a chat-completions body.
type fakeRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Content string `json:"content"`
	} `json:"messages"`
	Stream        bool `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// ServeHTTP answers as OpenAI does: counting ceil(content bytes / 4)
// prompt tokens, it sleeps a prefill time, then produces X-Fake-Output
// tokens at fakeTokenPace, sent at the end in one chat.completion, or as
// they come in chat.completion.chunk events (one a batch), with the usage in a last
// chunk of no choices when the request set stream_options.include_usage.
func (f *fakeLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req fakeRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	output, err := strconv.Atoi(r.Header.Get("X-Fake-Output"))
	if err != nil || output < 0 {
		http.Error(w, "X-Fake-Output: want the output tokens", http.StatusBadRequest)
		return
	}
	chars := 0
	for _, m := range req.Messages {
		chars += len(m.Content)
	}
	prompt := (chars + 3) / 4
	held := int64(prompt)
	f.held.add(held)
	defer func() { f.held.add(-held) }()
	time.Sleep(time.Duration(prompt) * time.Second / fakePrefill)

	model, _ := json.Marshal(req.Model)
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, prompt, output, prompt+output)
	chunk := `data: {"id":"chatcmpl-fake","object":"chat.completion.chunk","created":0,"model":` + string(model) +
		`,"choices":[{"index":0,"delta":%s,"finish_reason":%s}]%s}` + "\n\n"
	nullUsage := ""
	if req.StreamOptions.IncludeUsage {
		nullUsage = `,"usage":null`
	}
	if req.Stream {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, chunk, `{"role":"assistant","content":""}`, "null", nullUsage)
	}
	for done := 0; done < output; {
		batch := min(fakeBatch, output-done)
		select {
		case <-time.After(time.Duration(batch) * fakeTokenPace):
		case <-r.Context().Done():
			return
		}
		f.held.add(int64(batch))
		held += int64(batch)
		done += batch
		if req.Stream {
			fmt.Fprintf(w, chunk, `{"content":"`+strings.Repeat("tok ", batch)+`"}`, "null", nullUsage)
			w.(http.Flusher).Flush()
		}
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-fake","object":"chat.completion","created":0,"model":%s,`+
			`"choices":[{"index":0,"message":{"role":"assistant","content":"%s"},"finish_reason":"stop"}],"usage":%s}`,
			model, strings.Repeat("tok ", output), usage)
		return
	}
	fmt.Fprintf(w, chunk, "{}", `"stop"`, nullUsage)
	if req.StreamOptions.IncludeUsage {
		fmt.Fprintf(w, `data: {"id":"chatcmpl-fake","object":"chat.completion.chunk","created":0,"model":%s,"choices":[],"usage":%s}`+"\n\n", model, usage)
	}
	io.WriteString(w, "data: [DONE]\n\n")
}

// TestFakeLLM checks that the fake model answers as OpenAI does, since a
// learned estimate reads its usage as it would a real one's: a whole
// response carries it in `usage`; a stream that asked for it carries
// "usage":null on every chunk and the usage in a last chunk of no choices,
// then [DONE]; a stream that did not ask has no usage at all. The backend
// holds the prompt and the output while it answers, and nothing after.
func TestFakeLLM(t *testing.T) {
	f := newFakeLLM(t)
	const prompt, output = 25, 20
	content := strings.Repeat("x", prompt*4-2) // ceil(98/4) = 25
	ask := func(body string) []byte {
		t.Helper()
		r := post(context.Background(), http.DefaultClient, "http://"+f.addr+"/v1/chat/completions", body, "X-Fake-Output", strconv.Itoa(output))
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("%d %v: %s", r.status, r.err, r.body)
		}
		return []byte(r.body)
	}
	type usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	}
	want := usage{prompt, output, prompt + output}
	type choice struct {
		Message struct{ Content string }
		Delta   struct{ Content string }
	}
	type completion struct {
		Object  string
		Choices []choice
		Usage   *usage
	}
	messages := `"messages":[{"role":"user","content":"` + content + `"}]`

	var whole completion
	if err := json.Unmarshal(ask(`{"model":"m",`+messages+`}`), &whole); err != nil {
		t.Fatal(err)
	}
	if whole.Object != "chat.completion" || whole.Usage == nil || *whole.Usage != want ||
		len(whole.Choices) != 1 || len(whole.Choices[0].Message.Content) != 4*output {
		t.Fatalf("whole response: %+v, want usage %+v and %d characters", whole, want, 4*output)
	}

	for _, includeUsage := range []bool{true, false} {
		body := fmt.Sprintf(`{"model":"m",%s,"stream":true,"stream_options":{"include_usage":%t}}`, messages, includeUsage)
		events := strings.Split(strings.TrimSuffix(string(ask(body)), "\n\n"), "\n\n")
		if events[len(events)-1] != "data: [DONE]" {
			t.Fatalf("include_usage %t: the stream ends with %q, want [DONE]", includeUsage, events[len(events)-1])
		}
		var text string
		var last *usage
		for i, e := range events[:len(events)-1] {
			var c completion
			if err := json.Unmarshal([]byte(strings.TrimPrefix(e, "data: ")), &c); err != nil || c.Object != "chat.completion.chunk" {
				t.Fatalf("include_usage %t: event %q: %v", includeUsage, e, err)
			}
			if strings.Contains(e, `"usage"`) != includeUsage {
				t.Fatalf("include_usage %t: event %q", includeUsage, e)
			}
			for _, ch := range c.Choices {
				text += ch.Delta.Content
			}
			if c.Usage != nil && (i != len(events)-2 || len(c.Choices) != 0) {
				t.Fatalf("include_usage %t: usage in %q, want it only in the last chunk, of no choices", includeUsage, e)
			}
			last = c.Usage
		}
		if len(text) != 4*output || includeUsage != (last != nil) || (last != nil && *last != want) {
			t.Fatalf("include_usage %t: %d characters and usage %+v, want %d and %+v", includeUsage, len(text), last, 4*output, want)
		}
	}

	if peak, _ := f.held.read(); peak != prompt+output {
		t.Errorf("peak %d tokens in flight, want %d", peak, prompt+output)
	}
	eventually(t, "the backend holds no token", func() bool { return f.held.now() == 0 })
}
