package llm

import (
	"fmt"
	"math"
	"net/http"
)

// Defaults of TokensCost.
const (
	DefaultBytesPerToken = 4
	DefaultOutputTokens  = 1024
	DefaultMaxBody       = 1 << 20
)

// maxMaxBody bounds max_body: the body's first max_body bytes are held in
// memory by every request in flight.
const maxMaxBody = 1 << 30

// TokensCost estimates a request's cost in tokens from its body, an OpenAI-
// or Anthropic-style JSON request (chat completions, responses, messages):
//
//	cost = ceil(body bytes / bytes_per_token) + output
//
// where output is the largest of the top-level JSON fields `max_tokens`,
// `max_completion_tokens` and `max_output_tokens` whose value is a
// non-negative integer (1024.0 and 1e3 count; 1.5, negative numbers,
// strings, null and fields inside nested objects are ignored; a key given
// twice counts with its largest value), or `default_output` when the body
// has none of them. A body that is not a JSON object (not JSON, an array, a
// string) has no output field: ceil(bytes / bytes_per_token) plus
// `default_output`; no body (GET) counts
// `default_output` alone. A count beyond 2^63-1 (99999999999999999999,
// 1e30), and a sum beyond it, count as 2^63-1: nothing wraps around.
//
// The body is read, up to `max_body` bytes, before the request is admitted,
// and handed on to the next handler byte for byte (but for IncludeUsage's
// rewrite). A body longer than
// `max_body` is not read whole: its first `max_body` bytes are read and no
// more, the byte count is its Content-Length, and the output is
// `default_output`, since its JSON was not read; set `max_body` above the
// largest prompt you accept. A body longer than `max_body` without a
// Content-Length (chunked) counts as 2^63-1 tokens, which the engine clamps
// to the cap: it is admitted alone. To tell a body of unknown
// length that ends at `max_body` from a longer one, `max_body` + 1 bytes are
// read.
//
// Memory: each request in flight holds the bytes read (at most `max_body`,
// exactly the Content-Length when it is below) until the next handler has
// read them, so at most requests in flight × `max_body`.
type TokensCost struct {
	// BytesPerToken is how many body bytes count as one input token.
	// Default: 4.
	BytesPerToken int64 `json:"bytes_per_token,omitempty"`

	// DefaultOutput is the output tokens counted for a body that gives
	// none of max_tokens, max_completion_tokens, max_output_tokens; with
	// LearnOutput, the ceiling of the learned estimate and the estimate
	// until it is learnt. Default: 1024.
	DefaultOutput int64 `json:"default_output,omitempty"`

	// LearnOutput learns the output tokens a request counts from the
	// output tokens the model reported, per model the request bodies name
	// ({http.inflight.model}) and per zone, from the reports of requests
	// naming no output, or one at least DefaultOutput: from the 25th
	// report a conservative estimate (a report at or above their 90th
	// percentile 9 times in 10), from the 100th the 90th percentile of the
	// last 1,000 reports, never above DefaultOutput (Caddyfile:
	// `default_output auto [<ceiling>]`). A request naming a model without
	// an estimate of its own counts the zone's; a zone keeps at most 64
	// models. Once learnt, it is the output of a body naming none, and the
	// most a body naming more counts: a max_tokens is a ceiling clients
	// set generously (Anthropic's API requires one), not an estimate. A
	// request may then produce more than it reserved: see
	// docs/cost-tokens.md for what the backend really held against the
	// cap.
	LearnOutput bool `json:"learn_output,omitempty"`

	// MaxBody is the most bytes of a body read to estimate its cost and
	// read its model; a longer body counts its Content-Length and
	// DefaultOutput, and its model is _unknown. Up to 1 GiB. Default: 1 MiB
	// (1048576).
	MaxBody int64 `json:"max_body,omitempty"`

	// IncludeUsage makes OpenAI chat completions and completions streams
	// report their usage, which they do only when asked, so that the
	// request settles on it (see docs/cost-tokens.md). A POST to a path
	// ending in /chat/completions or /completions whose body was read
	// whole (not beyond MaxBody), a JSON object with the top-level field
	// `"stream": true` and no top-level `stream_options`, is handed on
	// with `"stream_options":{"include_usage":true}` inserted as its
	// first member, and its Content-Length updated (a chunked body stays
	// chunked); its estimate counts the body the client sent. A body that
	// has `stream_options`, whatever its value (include_usage false, or
	// options without it), is handed on unchanged, as is every other
	// request (the Responses and Anthropic APIs reject stream_options, and
	// report their usage anyway). The backend must accept stream_options,
	// as OpenAI-compatible servers do.
	//
	// The client of a rewritten request gets the stream it asked for:
	// each SSE event is held until its blank line, then passed on without
	// the chunk reporting the usage (top-level `"choices":[]` and a
	// `usage` that is not null), read first, and without the top-level
	// `"usage":null` member the other chunks carry, removed with the comma
	// that joins it to the members around it. An event longer than 64 KiB
	// is passed on unfiltered, as is the rest of its response; an event
	// the response ends within is passed on, filtered, when it ends.
	// Default: off.
	IncludeUsage bool `json:"include_usage,omitempty"`
}

// SetDefaults sets the zero values to their defaults.
func (t *TokensCost) SetDefaults() {
	if t.BytesPerToken == 0 {
		t.BytesPerToken = DefaultBytesPerToken
	}
	if t.DefaultOutput == 0 {
		t.DefaultOutput = DefaultOutputTokens
	}
	if t.MaxBody == 0 {
		t.MaxBody = DefaultMaxBody
	}
}

// Check reports the first value that is not allowed; zero values are the
// defaults' and allowed.
func (t *TokensCost) Check() error {
	switch {
	case t.BytesPerToken < 0:
		return fmt.Errorf("inflight: cost tokens: bytes_per_token %d is not allowed: want a positive integer (0 for the default, %d)", t.BytesPerToken, DefaultBytesPerToken)
	case t.DefaultOutput < 0:
		return fmt.Errorf("inflight: cost tokens: default_output %d is not allowed: want a positive integer (0 for the default, %d)", t.DefaultOutput, DefaultOutputTokens)
	case t.MaxBody < 0 || t.MaxBody > maxMaxBody:
		return fmt.Errorf("inflight: cost tokens: max_body %d is not allowed: want 1 to %d bytes (0 for the default, %d): the bytes read are held in memory", t.MaxBody, maxMaxBody, DefaultMaxBody)
	}
	return nil
}

// Estimate is a request's estimated cost, and whether the output count
// its model reports teaches the learned estimate: its body named no
// output, or one at least default_output, so that its output was free up
// to the estimate's ceiling at least.
//
// injected marks a body rewritten by include_usage: its response is
// filtered back to what the client asked for.
type Estimate struct {
	Cost     int64 // in tokens
	teaches  bool
	injected bool
}

// estimate returns the estimate of a request whose body b was read
// (ReadBody, with MaxBody), counting defaultOutput as the output of a body
// that names none, and at most learned (if positive: a learned estimate)
// as the output of one that names more. With IncludeUsage it may rewrite
// r's body (includeUsage).
func (t *TokensCost) estimate(r *http.Request, b *Body, defaultOutput, learned int64) Estimate {
	switch {
	case !b.present:
		return Estimate{Cost: defaultOutput, teaches: true}
	case r.ContentLength > t.MaxBody:
		return Estimate{Cost: addTokens(t.inputTokens(r.ContentLength), defaultOutput), teaches: true}
	case b.over: // of unknown length
		return Estimate{Cost: math.MaxInt64}
	}
	named, ok := b.fields.output, b.fields.named
	output := defaultOutput
	if ok {
		output = named
		if learned > 0 {
			output = min(named, learned)
		}
	}
	injected := t.IncludeUsage && b.whole && includeUsage(r, b.read, b.replay)
	return Estimate{Cost: addTokens(t.inputTokens(int64(len(b.read))), output), teaches: !ok || named >= t.DefaultOutput, injected: injected}
}

// inputTokens is ceil(n / BytesPerToken), without overflow.
func (t *TokensCost) inputTokens(n int64) int64 {
	tokens := n / t.BytesPerToken
	if n%t.BytesPerToken != 0 {
		tokens++
	}
	return tokens
}

// addTokens adds two non-negative counts, saturating at math.MaxInt64.
func addTokens(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
