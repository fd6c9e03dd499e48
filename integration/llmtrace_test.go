package integration

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// traceRequest is one request of a replayed trace: a real OpenAI
// chat-completions body, and the output the fake model is to produce for
// it, which a real client cannot choose (it is sent out of band, in
// X-Fake-Output).
type traceRequest struct {
	body   []byte
	output int
}

// llmShape is the lognormal shape of one kind of traffic's prompt and
// output lengths, in tokens: median·exp(sigma·Z).
type llmShape struct {
	model                     string
	promptMedian, promptSigma float64
	outputMedian, outputSigma float64
}

// The medians are the Azure LLM inference traces of 2023 as published in
// Splitwise (Patel et al., ISCA 2024): conversation prompts median about
// 1020 tokens and outputs about 129; code completion prompts about 1500
// and outputs about 13. The conversation output sigma, 0.92, gives what
// chat services report: a median of 130, a p90 of about 420 and a mean
// of about 200 tokens. The other sigmas are this trace's assumption (the
// paper shows wide, heavy-tailed curves but gives no fit): 0.7 puts a
// conversation prompt's mean near 1,300 and its p90 near 2,500, and code
// outputs, 1.0, have a p90 of about 47.
var (
	conversationShape = llmShape{model: "llm-chat", promptMedian: 1020, promptSigma: 0.7, outputMedian: 130, outputSigma: 0.92}
	codeShape         = llmShape{model: "llm-code", promptMedian: 1500, promptSigma: 0.7, outputMedian: 13, outputSigma: 1.0}
)

// A model's context bounds the heavy tails: prompts and outputs beyond
// them are clipped, as the model would refuse or cut them.
const (
	traceMaxPrompt = 16384
	traceMaxOutput = 4096
)

// The mix, an assumption in the proportions of the Azure traces' two
// services and of what chat clients send: 75 % conversation and 25 % code;
// half streamed, of which 80 % ask for the usage (stream_options
// include_usage, which the learned estimate needs to see the output of a
// stream); 20 % give a max_tokens, which then clips their output.
const (
	traceConversation = 0.75
	traceStreamed     = 0.5
	traceIncludeUsage = 0.8
	traceMaxTokens    = 0.2
)

// traceMaxTokensValues are the max_tokens a client gives, equally likely.
var traceMaxTokensValues = []int{256, 512, 1024, 2048, 4096}

// chatBody is the chat-completions request a client sends.
type chatBody struct {
	Model         string         `json:"model"`
	Messages      []chatMessage  `json:"messages"`
	Stream        bool           `json:"stream,omitempty"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
	MaxTokens     int            `json:"max_tokens,omitempty"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// llmTrace returns n requests drawn from seed: the same seed, the same
// trace, so that every mode a test compares replays the same traffic.
func llmTrace(t testing.TB, seed uint64, n int) []traceRequest {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed))
	trace := make([]traceRequest, n)
	for i := range trace {
		shape := codeShape
		if rng.Float64() < traceConversation {
			shape = conversationShape
		}
		prompt := lognormal(rng, shape.promptMedian, shape.promptSigma, traceMaxPrompt)
		body := chatBody{
			Model: shape.model,
			// Four characters a token, as the backend and `cost tokens` count.
			Messages: []chatMessage{{Role: "user", Content: strings.Repeat("tok ", prompt)}},
		}
		output := lognormal(rng, shape.outputMedian, shape.outputSigma, traceMaxOutput)
		if rng.Float64() < traceStreamed {
			body.Stream = true
			if rng.Float64() < traceIncludeUsage {
				body.StreamOptions = &streamOptions{IncludeUsage: true}
			}
		}
		if rng.Float64() < traceMaxTokens {
			body.MaxTokens = traceMaxTokensValues[rng.IntN(len(traceMaxTokensValues))]
			output = min(output, body.MaxTokens)
		}
		raw, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		trace[i] = traceRequest{body: raw, output: output}
	}
	return trace
}

// lognormal draws median·exp(sigma·Z), rounded, from 1 to most.
func lognormal(rng *rand.Rand, median, sigma float64, most int) int {
	v := math.Round(median * math.Exp(sigma*rng.NormFloat64()))
	return int(min(max(v, 1), float64(most)))
}

// TestLLMTrace checks that the trace has the published shape it claims,
// and that a seed replays the same trace: the replay's comparison rests
// on both. The draw is seeded, so the bounds judge the generator, not
// luck.
func TestLLMTrace(t *testing.T) {
	trace := llmTrace(t, replaySeed, 4000)
	if again := llmTrace(t, replaySeed, 4000); !tracesEqual(trace, again) {
		t.Fatal("the same seed drew another trace")
	}
	var chat, code, chatOut, codeOut []float64
	var streamed, usage, capped int
	for _, r := range trace {
		var b chatBody
		if err := json.Unmarshal(r.body, &b); err != nil {
			t.Fatal(err)
		}
		prompt := float64(len(b.Messages[0].Content)) / 4
		if b.Model == conversationShape.model {
			chat = append(chat, prompt)
		} else {
			code = append(code, prompt)
		}
		switch {
		case b.MaxTokens > 0:
			capped++
			if r.output > b.MaxTokens {
				t.Fatalf("output %d beyond max_tokens %d", r.output, b.MaxTokens)
			}
		case b.Model == conversationShape.model:
			chatOut = append(chatOut, float64(r.output))
		default:
			codeOut = append(codeOut, float64(r.output))
		}
		if b.Stream {
			streamed++
			if b.StreamOptions != nil {
				usage++
			}
		}
	}
	n := float64(len(trace))
	within(t, "conversation share", float64(len(chat))/n, 0.72, 0.78)
	within(t, "streamed share", float64(streamed)/n, 0.47, 0.53)
	within(t, "include_usage share of streams", float64(usage)/float64(streamed), 0.77, 0.83)
	within(t, "max_tokens share", float64(capped)/n, 0.18, 0.22)
	within(t, "conversation prompt median", quantile(chat, 0.5), 950, 1090)
	within(t, "code prompt median", quantile(code, 0.5), 1400, 1600)
	within(t, "conversation output median", quantile(chatOut, 0.5), 120, 140)
	within(t, "conversation output p90", quantile(chatOut, 0.9), 380, 460)
	within(t, "conversation output mean", mean(chatOut), 180, 220)
	within(t, "code output median", quantile(codeOut, 0.5), 11, 15)
}

func tracesEqual(a, b []traceRequest) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].output != b[i].output || !bytes.Equal(a[i].body, b[i].body) {
			return false
		}
	}
	return true
}

func within(t *testing.T, what string, v, lo, hi float64) {
	t.Helper()
	if v < lo || v > hi {
		t.Errorf("%s %.2f, want %.2f to %.2f", what, v, lo, hi)
	}
}

// quantile is the q-quantile of vs, nearest rank; it sorts vs.
func quantile(vs []float64, q float64) float64 {
	slices.Sort(vs)
	return vs[min(int(q*float64(len(vs))), len(vs)-1)]
}

func mean(vs []float64) float64 {
	var sum float64
	for _, v := range vs {
		sum += v
	}
	return sum / float64(len(vs))
}
