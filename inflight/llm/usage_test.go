package llm

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// usageCase is a body and the usage read from it.
type usageCase struct {
	name  string
	body  string
	want  TokenUsage
	final bool
}

// usageCases are the bodies the scanner is tested and fuzzed with.
func usageCases() []usageCase {
	big := `{"usage":{"prompt_tokens":5,"completion_tokens":7,"note":"` + strings.Repeat("{[x", 1400) + `"}}` + "\n"
	return []usageCase{
		{"openai chat json", openAIChatJSON, reported(1117, 46, 1024), true},
		{"openai chat stream", openAIChatStream(true, false), reported(19, 14, 0), true},
		{"openai chat stream without include_usage", openAIChatStream(false, false), TokenUsage{}, false},
		{"openai chat stream cut before usage", openAIChatStream(true, true), TokenUsage{}, false},
		{"openai responses json", openAIResponsesJSON, reported(328, 52, 256), true},
		{"openai responses stream", openAIResponsesStream, reported(37, 11, 0), true},
		{"anthropic json", anthropicJSON, reported(12+2048+4096, 96, 4096), true},
		{"anthropic stream", anthropicStream, reported(25+1800, 15, 1800), true},
		{"anthropic stream cut after message_start", anthropicStreamStart, reported(1825, 1, 1800), false},
		{"anthropic stream with CRLF", strings.ReplaceAll(anthropicStream, "\n", "\r\n"), reported(1825, 15, 1800), true},
		{"a string ending in backslashes", `{"a":"C:\\\\","usage":{"completion_tokens":3},"b":"\\\"usage\\\":{\\\"completion_tokens\\\":4}"}`, reported(0, 3, 0), true},
		{"an escaped key", `{"us\u0061ge":{"completion_tokens":3}}`, TokenUsage{}, false},
		{"usage as a value", `{"type":"usage","x":{"completion_tokens":3}}`, TokenUsage{}, false},
		{"negative fractional non-numeric", `{"usage":{"prompt_tokens":-5,"completion_tokens":1.5,"output_tokens":"12","input_tokens":1e3,"cache_read_input_tokens":true}}`, TokenUsage{}, false},
		{"huge", `{"usage":{"prompt_tokens":99999999999999999999999,"completion_tokens":9223372036854775807,"prompt_tokens_details":{"cached_tokens":9223372036854775808}}}`, reported(math.MaxInt64, math.MaxInt64, math.MaxInt64), true},
		{"huge anthropic sum", `{"usage":{"input_tokens":9223372036854775000,"cache_creation_input_tokens":9223372036854775000,"cache_read_input_tokens":1,"output_tokens":0}}`, reported(math.MaxInt64, 0, 1), true},
		{"over 4 KiB", big, TokenUsage{}, false},
		{"over 4 KiB then a usage", big + `{"usage":{"prompt_tokens":8,"completion_tokens":9}}`, reported(8, 9, 0), true},
		{"broken object", `{"usage":{"prompt_tokens":8,"completion_tokens" 9}}`, TokenUsage{}, false},
		{"cut object then an event", "data: {\"usage\":{\"completion_tokens\":\n\nevent: message_delta\ndata: {\"usage\":{\"output_tokens\":15}}\n\n", reported(0, 15, 0), true},
	}
}

// scanned writes body to a new scanner in the pieces cut at splits.
func scanned(body string, splits ...int) (TokenUsage, bool) {
	var s usageScanner
	last := 0
	for _, at := range splits {
		s.write([]byte(body[last:at]))
		last = at
	}
	s.write([]byte(body[last:]))
	return s.usage()
}

func TestUsageScanner(t *testing.T) {
	for _, c := range usageCases() {
		if u, final := scanned(c.body); u != c.want || final != c.final {
			t.Errorf("%s: got %+v, %v; want %+v, %v", c.name, u, final, c.want, c.final)
		}
	}
}

// TestUsageScannerSplits writes each body in two pieces cut at every byte,
// and a byte at a time: a key, an escape or an object cut anywhere is read.
func TestUsageScannerSplits(t *testing.T) {
	for _, c := range usageCases() {
		for at := range len(c.body) + 1 {
			if u, final := scanned(c.body, at); u != c.want || final != c.final {
				t.Fatalf("%s cut at %d (%q|%q): got %+v, %v; want %+v, %v",
					c.name, at, c.body[max(at-20, 0):at], c.body[at:min(at+20, len(c.body))], u, final, c.want, c.final)
			}
		}
		each := make([]int, len(c.body))
		for i := range each {
			each[i] = i
		}
		if u, final := scanned(c.body, each...); u != c.want || final != c.final {
			t.Errorf("%s a byte at a time: got %+v, %v; want %+v, %v", c.name, u, final, c.want, c.final)
		}
	}
}

// TestUsageBodiesAreJSON checks the test bodies are what an API could send:
// valid JSON, or SSE whose data lines are.
func TestUsageBodiesAreJSON(t *testing.T) {
	for _, c := range usageCases()[:10] {
		if !strings.Contains(c.body, "data: ") {
			if !json.Valid([]byte(c.body)) {
				t.Errorf("%s is not valid JSON", c.name)
			}
			continue
		}
		for line := range strings.Lines(c.body) {
			data, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: ")
			if ok && data != "[DONE]" && !json.Valid([]byte(data)) {
				t.Errorf("%s: data line is not valid JSON: %s", c.name, data)
			}
		}
	}
}

// TestUsagePrettyPrinted reads usage from JSON indented in two styles, with
// the usage object across lines.
func TestUsagePrettyPrinted(t *testing.T) {
	var v any
	if err := json.Unmarshal([]byte(anthropicJSON), &v); err != nil {
		t.Fatal(err)
	}
	for _, indent := range []string{"  ", "\t"} {
		body, _ := json.MarshalIndent(v, "", indent)
		if u, final := scanned(string(body)); u != (reported(6156, 96, 4096)) || !final {
			t.Errorf("indented with %q: got %+v, %v", indent, u, final)
		}
	}
	spaced := "{\n  \"usage\"\n    :\n    {\n      \"prompt_tokens\" : 3 ,\n      \"completion_tokens\" :\n 4\n    }\n}\n"
	if u, final := scanned(spaced); u != (reported(3, 4, 0)) || !final {
		t.Errorf("spaced: got %+v, %v", u, final)
	}
}

// TestUsageScannerReset reuses a scanner as the pool will: nothing of the
// last body is left, and a body with usage then allocates nothing.
func TestUsageScannerReset(t *testing.T) {
	var s usageScanner
	s.write([]byte(anthropicStream))
	s.reset()
	if u, final := s.usage(); u != (TokenUsage{}) || final {
		t.Fatalf("after reset: got %+v, %v", u, final)
	}
	s.write([]byte("event: message_start\n"))
	s.reset()
	s.write([]byte(`data: {"usage":{"output_tokens":2}}` + "\n\n"))
	if u, final := s.usage(); u.Output != 2 || !final {
		t.Fatalf("the event name outlived reset: got %+v, %v", u, final)
	}
	body := []byte(openAIChatStream(true, false))
	if allocs := testing.AllocsPerRun(20, func() { s.reset(); s.write(body) }); allocs != 0 {
		t.Errorf("a scan allocated %v times", allocs)
	}
}

// FuzzUsageScanner writes arbitrary bytes whole and cut at two points: the
// results must agree, and nothing may panic.
func FuzzUsageScanner(f *testing.F) {
	for _, c := range usageCases() {
		f.Add([]byte(c.body), uint16(len(c.body)/3), uint16(len(c.body)/2))
	}
	f.Add([]byte(`"usage":{"a":"\`), uint16(8), uint16(14))
	f.Add([]byte("event: message_start\r\n\r\ndata: {\"usage\":{\"output_tokens\":1}}"), uint16(5), uint16(30))
	f.Fuzz(func(t *testing.T, body []byte, a, b uint16) {
		i, j := min(int(a), len(body)), min(int(b), len(body))
		if i > j {
			i, j = j, i
		}
		wantU, wantFinal := scanned(string(body))
		if u, final := scanned(string(body), i, j); u != wantU || final != wantFinal {
			t.Fatalf("cut at %d and %d: got %+v, %v; whole: %+v, %v", i, j, u, final, wantU, wantFinal)
		}
		if wantU.Input < 0 || wantU.Output < 0 || wantU.Cached < 0 {
			t.Fatalf("negative usage %+v", wantU)
		}
		if !bytes.Contains(body, []byte(`"usage"`)) && (wantU != TokenUsage{} || wantFinal) {
			t.Fatalf("usage %+v, %v read from a body without a usage key", wantU, wantFinal)
		}
	})
}

// BenchmarkUsageScanner reads a 64 KiB SSE stream and a 16 KiB JSON body.
func BenchmarkUsageScanner(b *testing.B) {
	var stream strings.Builder
	for stream.Len() < 64<<10 {
		stream.WriteString(`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"The quick brown fox \"jumps\" over the lazy dog; then it writes C:\\temp and {\"a\": [1, 2]}."}}` + "\n\n")
	}
	stream.WriteString("event: message_delta\n" + `data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}` + "\n\n")
	text := strings.Repeat(`Lorem ipsum dolor sit amet, \"consectetur\" adipiscing elit.\n`, (16<<10)/64)
	jsonBody := `{"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` + text + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1117,"completion_tokens":46,"total_tokens":1163,"prompt_tokens_details":{"cached_tokens":1024}}}`
	for _, body := range []struct{ name, body string }{{"sse64k", stream.String()}, {"json16k", jsonBody}} {
		b.Run(body.name, func(b *testing.B) {
			p := []byte(body.body)
			var s usageScanner
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			for b.Loop() {
				s.reset()
				for chunk := p; len(chunk) > 0; chunk = chunk[min(4096, len(chunk)):] {
					s.write(chunk[:min(4096, len(chunk))])
				}
			}
			if _, final := s.usage(); !final {
				b.Fatal("no usage read")
			}
		})
	}
}

// reported is the usage of input, output and cached tokens.
func reported(input, output, cached int64) TokenUsage {
	return TokenUsage{Input: input, Output: output, Cached: cached}
}
