package integration

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"testing"
)

// modelModes replay the trace's two models, chat and code completion,
// whose outputs differ tenfold (medians 130 and 13 tokens), through one
// zone each at the same cap: `per-model` as the trace names them, so that
// the zone learns an estimate per model; `one-model` with every request
// naming one model, so that it learns one estimate of the two mixed.
var modelModes = []replayMode{
	{name: "per-model", costTokens: "default_output auto"},
	{name: "one-model", costTokens: "default_output auto", oneModel: "llm-both"},
}

// TestLLMReplayModels replays the trace with an estimate per model and
// with one mixed estimate: each model's estimate comes within 10 % of the
// 90th percentile of its own outputs that taught it, and the real tokens
// in flight stay within 1.1 times the cap. It logs the throughput of
// both.
func TestLLMReplayModels(t *testing.T) {
	trace := llmTrace(t, replaySeed, replayWarmup+replayMeasured+replayClients)
	results := replayResults(t, "llm-replay-models", replay(t, modelModes, trace))
	for mode, res := range results {
		if res.wholePeak > 1.1 {
			t.Errorf("%s: real tokens in flight peaked at %.2f×cap, want at most 1.1", mode, res.wholePeak)
		}
	}
	perModel, oneModel := results["per-model"], results["one-model"]
	t.Logf("llm-replay-models per-model/one-model req/s=%.3f warmed-up, %.3f whole-run",
		perModel.reqPerSec/oneModel.reqPerSec, perModel.wholeReqPerSec/oneModel.wholeReqPerSec)
	mixed := metric(t, "caddy_inflight_output_estimate_tokens", `zone="llm-one-model"`, `model=""`)
	for model, p90 := range teachingP90(t, trace) {
		got := metric(t, "caddy_inflight_output_estimate_tokens", `zone="llm-per-model"`, `model="`+model+`"`)
		t.Logf("llm-replay-models %s: estimate %v tokens, its own p90 %v, the one mixed estimate %v", model, got, p90, mixed)
		if math.Abs(got-p90) > 0.1*p90 {
			t.Errorf("%s: estimate %v tokens, want within 10 %% of its own outputs' p90, %v", model, got, p90)
		}
	}
}

// namingOneModel returns trace with every request naming model, a name as
// long as the trace's own.
func namingOneModel(trace []traceRequest, model string) []traceRequest {
	out := make([]traceRequest, len(trace))
	for i, r := range trace {
		body := bytes.Replace(r.body, []byte(`"model":"`+conversationShape.model+`"`), []byte(`"model":"`+model+`"`), 1)
		body = bytes.Replace(body, []byte(`"model":"`+codeShape.model+`"`), []byte(`"model":"`+model+`"`), 1)
		out[i] = traceRequest{body: body, output: r.output}
	}
	return out
}

// teachingP90 returns, per model, the 90th percentile (nearest rank) of the
// outputs of the trace's requests that teach the learned estimate: those
// that report their usage (not streamed, or streamed with include_usage)
// and name no max_tokens, or one of at least default_output, 1024.
func teachingP90(t *testing.T, trace []traceRequest) map[string]float64 {
	t.Helper()
	outputs := map[string][]float64{}
	for _, r := range trace {
		var b chatBody
		if err := json.Unmarshal(r.body, &b); err != nil {
			t.Fatal(err)
		}
		if (b.Stream && b.StreamOptions == nil) || (b.MaxTokens > 0 && b.MaxTokens < 1024) {
			continue
		}
		outputs[b.Model] = append(outputs[b.Model], float64(r.output))
	}
	p90 := map[string]float64{}
	for model, vs := range outputs {
		p90[model] = nearestRank(vs, 0.9)
	}
	return p90
}

// nearestRank is the q-quantile of vs by nearest rank, as the learned
// estimate reads it; it sorts vs.
func nearestRank(vs []float64, q float64) float64 {
	slices.Sort(vs)
	return vs[int(math.Ceil(q*float64(len(vs))))-1]
}
