package integration

import (
	"encoding/json"
	"math"
	"math/rand/v2"
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
