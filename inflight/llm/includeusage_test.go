package llm

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// TestIncludeUsageRewrite: which request bodies include_usage rewrites, and
// that the rewritten body differs from the client's by the inserted member
// alone, with its length updated and its estimate unchanged.
func TestIncludeUsageRewrite(t *testing.T) {
	const opt = `"stream_options":{"include_usage":true},`
	chat := `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for _, c := range []struct {
		name    string
		method  string
		path    string
		body    string
		chunked bool  // sent without a Content-Length
		maxBody int64 // 0: the default
		want    string
	}{
		{name: "chat completions", path: "/v1/chat/completions", body: chat, want: "{" + opt + chat[1:]},
		{name: "completions", path: "/v1/completions", body: `{"model":"m","prompt":"x","stream":true}`, want: `{` + opt + `"model":"m","prompt":"x","stream":true}`},
		{name: "another prefix", path: "/openai/deployments/d/chat/completions", body: chat, want: "{" + opt + chat[1:]},
		{name: "chunked", path: "/v1/chat/completions", body: chat, chunked: true, want: "{" + opt + chat[1:]},
		{name: "whitespace kept", path: "/v1/chat/completions", body: " \n{ \"stream\" : true }\n", want: " \n{" + opt + " \"stream\" : true }\n"},
		{name: "escaped stream key", path: "/v1/chat/completions", body: `{"stre\u0061m":true}`, want: `{` + opt + `"stre\u0061m":true}`},
		{name: "stream_options nested only", path: "/v1/chat/completions", body: `{"metadata":{"stream_options":1},"stream":true}`, want: `{` + opt + `"metadata":{"stream_options":1},"stream":true}`},
		{name: "last stream true", path: "/v1/chat/completions", body: `{"stream":false,"stream":true}`, want: `{` + opt + `"stream":false,"stream":true}`},
		{name: "body exactly max_body", path: "/v1/chat/completions", body: chat, maxBody: int64(len(chat)), want: "{" + opt + chat[1:]},

		{name: "responses API", path: "/v1/responses", body: chat},
		{name: "anthropic messages", path: "/v1/messages", body: chat},
		{name: "path with a suffix", path: "/v1/chat/completions/x", body: chat},
		{name: "PUT", method: http.MethodPut, path: "/v1/chat/completions", body: chat},
		{name: "stream false", path: "/v1/chat/completions", body: `{"model":"m","stream":false}`},
		{name: "no stream", path: "/v1/chat/completions", body: `{"model":"m"}`},
		{name: "stream a string", path: "/v1/chat/completions", body: `{"stream":"true"}`},
		{name: "last stream false", path: "/v1/chat/completions", body: `{"stream":true,"stream":false}`},
		{name: "stream_options include_usage false", path: "/v1/chat/completions", body: `{"stream":true,"stream_options":{"include_usage":false}}`},
		{name: "stream_options null", path: "/v1/chat/completions", body: `{"stream_options":null,"stream":true}`},
		{name: "stream_options escaped", path: "/v1/chat/completions", body: `{"stream":true,"stream_\u006fptions":{}}`},
		{name: "STREAM", path: "/v1/chat/completions", body: `{"STREAM":true}`},
		{name: "not JSON", path: "/v1/chat/completions", body: `{"stream":true,}`},
		{name: "trailing bytes", path: "/v1/chat/completions", body: `{"stream":true} {}`},
		{name: "array", path: "/v1/chat/completions", body: `[{"stream":true}]`},
		{name: "empty object", path: "/v1/chat/completions", body: `{}`},
		{name: "beyond max_body", path: "/v1/chat/completions", body: chat, maxBody: int64(len(chat)) - 1},
		{name: "chunked beyond max_body", path: "/v1/chat/completions", body: chat, chunked: true, maxBody: int64(len(chat)) - 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			method := c.method
			if method == "" {
				method = http.MethodPost
			}
			request := func() *http.Request {
				r := httptest.NewRequest(method, c.path, strings.NewReader(c.body))
				r.ContentLength, r.Header["Content-Length"] = -1, nil
				if !c.chunked {
					r.ContentLength = int64(len(c.body))
					r.Header.Set("Content-Length", strconv.Itoa(len(c.body)))
				}
				return r
			}
			off := tokensCost(c.maxBody)
			on := tokensCost(c.maxBody)
			on.IncludeUsage = true

			r := request()
			est, err := estimateRequest(on, r, 1024, 0)
			if err != nil {
				t.Fatal(err)
			}
			plain, _ := estimateRequest(off, request(), 1024, 0)
			if est.Cost != plain.Cost || est.teaches != plain.teaches {
				t.Errorf("estimate %+v, without include_usage %+v", est, plain)
			}
			got, err := io.ReadAll(r.Body)
			if err != nil {
				t.Fatal(err)
			}
			want := c.want
			if want == "" {
				want = c.body
			}
			if string(got) != want {
				t.Errorf("body\n%s\nwant\n%s", got, want)
			}
			if est.injected != (c.want != "") {
				t.Errorf("injected = %v", est.injected)
			}
			wantLength, wantHeader := int64(len(want)), strconv.Itoa(len(want))
			if c.chunked {
				wantLength, wantHeader = -1, ""
			}
			if r.ContentLength != wantLength || r.Header.Get("Content-Length") != wantHeader {
				t.Errorf("ContentLength %d, Content-Length %q; want %d, %q", r.ContentLength, r.Header.Get("Content-Length"), wantLength, wantHeader)
			}
		})
	}
}

// filtered writes body to a Writer whose request include_usage
// rewrote, in pieces cut at the splits, then finishes it: what the client
// got, and the writer.
func filtered(t *testing.T, contentType, body string, splits ...int) (string, *Writer) {
	t.Helper()
	u, rec := newWriter("Content-Type", contentType)
	u.injected = true
	last := 0
	for _, at := range append(splits, len(body)) {
		if n, err := u.Write([]byte(body[last:at])); err != nil || n != at-last {
			t.Fatalf("Write: %d, %v; want %d", n, err, at-last)
		}
		last = at
	}
	u.End()
	return rec.body.String(), u
}

// TestIncludeUsageFilter: a stream that include_usage asked for reaches the
// client as the stream it would have had without: the usage chunk read,
// then dropped, "usage":null removed from the others, [DONE] kept; cut at
// every byte, with LF or CRLF line ends.
func TestIncludeUsageFilter(t *testing.T) {
	for _, crlf := range []bool{false, true} {
		asked, plain := openAIChatStream(true, false), openAIChatStream(false, false)
		if crlf {
			asked, plain = strings.ReplaceAll(asked, "\n", "\r\n"), strings.ReplaceAll(plain, "\n", "\r\n")
		}
		for i := 0; i <= len(asked); i++ {
			got, u := filtered(t, "text/event-stream; charset=utf-8", asked, i)
			if got != plain {
				t.Fatalf("crlf %v, cut at %d: got\n%q\nwant\n%q", crlf, i, got, plain)
			}
			if usage, final := u.scan.usage(); usage != reported(19, 14, 0) || !final {
				t.Fatalf("crlf %v, cut at %d: usage %+v, %v", crlf, i, usage, final)
			}
		}
		bytewise := make([]int, len(asked)-1)
		for i := range bytewise {
			bytewise[i] = i + 1
		}
		if got, _ := filtered(t, "text/event-stream", asked, bytewise...); got != plain {
			t.Errorf("crlf %v, byte by byte: got\n%q", crlf, got)
		}
	}
}

// TestIncludeUsageFilterEvents: what is removed from one event, exactly.
func TestIncludeUsageFilterEvents(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"usage last", `data: {"id":"1","choices":[{"delta":{}}],"usage":null}` + "\n\n", `data: {"id":"1","choices":[{"delta":{}}]}` + "\n\n"},
		{"usage first", `data: {"usage":null,"id":"1"}` + "\n\n", `data: {"id":"1"}` + "\n\n"},
		{"usage between", `data: {"id":"1","usage":null,"x":2}` + "\n\n", `data: {"id":"1","x":2}` + "\n\n"},
		{"usage alone", `data: {"usage":null}` + "\n\n", `data: {}` + "\n\n"},
		{"spaced as written", `data: {"id": "1", "usage" : null, "x": 2}` + "\n\n", `data: {"id": "1", "x": 2}` + "\n\n"},
		{"no space after data:", `data:{"id":"1","usage":null}` + "\n\n", `data:{"id":"1"}` + "\n\n"},
		{"other lines kept", "event: chunk\nid: 7\n" + `data: {"id":"1","usage":null}` + "\n\n", "event: chunk\nid: 7\n" + `data: {"id":"1"}` + "\n\n"},
		{"usage chunk dropped", `data: {"id":"1","choices":[ ],"usage":{"prompt_tokens":1,"completion_tokens":2}}` + "\n\n", ""},
		{"usage chunk CRLF dropped", "data: {\"choices\":[],\"usage\":{\"completion_tokens\":2}}\r\n\r\n", ""},
		{"mixed blank line", "data: {\"usage\":null,\"a\":1}\n\r\ndata: [DONE]\n\n", "data: {\"a\":1}\n\r\ndata: [DONE]\n\n"},

		{"done kept", "data: [DONE]\n\n", "data: [DONE]\n\n"},
		{"comment kept", ": keep-alive\n\n", ": keep-alive\n\n"},
		{"blank lines kept", "\n\n\r\n", "\n\n\r\n"},
		{"usage with choices kept", `data: {"choices":[{"delta":{}}],"usage":{"completion_tokens":2}}` + "\n\n", `data: {"choices":[{"delta":{}}],"usage":{"completion_tokens":2}}` + "\n\n"},
		{"usage without choices kept", `data: {"usage":{"completion_tokens":2}}` + "\n\n", `data: {"usage":{"completion_tokens":2}}` + "\n\n"},
		{"nested usage null kept", `data: {"a":{"usage":null}}` + "\n\n", `data: {"a":{"usage":null}}` + "\n\n"},
		{"usage null in a string kept", `data: {"a":"\"usage\":null,"}` + "\n\n", `data: {"a":"\"usage\":null,"}` + "\n\n"},
		{"usage twice kept", `data: {"usage":null,"usage":null}` + "\n\n", `data: {"usage":null,"usage":null}` + "\n\n"},
		{"usage false kept", `data: {"usage":false}` + "\n\n", `data: {"usage":false}` + "\n\n"},
		{"two data lines kept", "data: {\"usage\":null}\ndata: {\"usage\":null}\n\n", "data: {\"usage\":null}\ndata: {\"usage\":null}\n\n"},
		{"broken JSON kept", `data: {"usage":null,}` + "\n\n", `data: {"usage":null,}` + "\n\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got, _ := filtered(t, "text/event-stream", c.in); got != c.want {
				t.Errorf("got\n%q\nwant\n%q", got, c.want)
			}
		})
	}
}

// TestIncludeUsageFilterHolds: an event is held until it ends, Flush passes
// on what ended, finish what the response ended within; an event over 64
// KiB, and all after it, pass unfiltered; only include_usage streams are
// filtered.
func TestIncludeUsageFilterHolds(t *testing.T) {
	u, rec := newWriter("Content-Type", "text/event-stream")
	u.injected = true
	first := `data: {"id":"1","usage":null}` + "\n\n"
	cut := `data: {"id":"2","choices":[],"usage":null}`
	u.Write([]byte(first + cut))
	u.Flush()
	if rec.body.String() != `data: {"id":"1"}`+"\n\n" || rec.flushes != 1 {
		t.Fatalf("flushed %q, %d flushes", rec.body.String(), rec.flushes)
	}
	u.End() // the stream was cut: its last event goes, filtered
	if want := `data: {"id":"1"}` + "\n\n" + `data: {"id":"2","choices":[]}`; rec.body.String() != want {
		t.Fatalf("finished: %q, want %q", rec.body.String(), want)
	}

	cutJSON := `data: {"id":"3","usage":nu`
	if got, _ := filtered(t, "text/event-stream", first+cutJSON); got != `data: {"id":"1"}`+"\n\n"+cutJSON {
		t.Errorf("a stream cut mid-JSON: %q", got)
	}

	big := `data: {"id":"` + strings.Repeat("x", maxHeldEvent) + `","usage":null}` + "\n\n"
	after := `data: {"id":"4","usage":null}` + "\n\n"
	for _, splits := range [][]int{nil, {len(first) + 10}, {len(first) + len(big) - 1}, {len(first) + maxHeldEvent/2, len(first) + len(big) + 3}} {
		if got, _ := filtered(t, "text/event-stream", first+big+after, splits...); got != `data: {"id":"1"}`+"\n\n"+big+after {
			t.Errorf("an event over 64 KiB, cut at %v: not passed unfiltered from there on (%d bytes)", splits, len(got))
		}
	}
	u, rec = newWriter("Content-Type", "text/event-stream")
	u.injected = true
	unended := big[:len(big)-5]
	for i := 0; i < len(unended); i += 1000 { // not ended yet: nothing beyond 64 KiB is held
		u.Write([]byte(unended[i:min(i+1000, len(unended))]))
	}
	if rec.body.Len() != len(unended) || cap(u.events.held) > maxHeldEvent {
		t.Errorf("an unended event over 64 KiB: %d bytes passed on, %d held", rec.body.Len(), cap(u.events.held))
	}
	fits := `data: {"id":"` + strings.Repeat("x", maxHeldEvent-100) + `","usage":null}` + "\n\n"
	if got, _ := filtered(t, "text/event-stream", fits+after, 10); got != strings.Replace(fits, `,"usage":null`, "", 1)+`data: {"id":"4"}`+"\n\n" {
		t.Errorf("an event under 64 KiB was not filtered")
	}

	asked := openAIChatStream(true, false)
	if got, _ := filtered(t, "application/json", asked); got != asked {
		t.Errorf("a JSON answer was filtered")
	}
	u, rec = newWriter("Content-Type", "text/event-stream")
	u.Write([]byte(asked))
	u.End()
	if rec.body.String() != asked {
		t.Errorf("a stream include_usage did not ask for was filtered")
	}
}

// TestIncludeUsageFilterWrites: writes return what they accepted, a
// failing client's error is returned, and whole events written at once
// cost no allocation.
func TestIncludeUsageFilterWrites(t *testing.T) {
	var f eventFilter
	broken := errors.New("client left")
	calls := 0
	out := func(p []byte) (int, error) {
		if calls++; calls == 3 { // the second event: the first took two writes
			return 0, broken
		}
		return len(p), nil
	}
	events := "data: {\"usage\":null,\"a\":1}\n\ndata: {\"b\":2}\n\ndata: {\"c\":"
	n, err := f.write(out, []byte(events))
	if !errors.Is(err, broken) || n != len("data: {\"usage\":null,\"a\":1}\n\n") {
		t.Errorf("a failing write: %d, %v", n, err)
	}

	var sink bytes.Buffer
	f = eventFilter{}
	stream := []byte(openAIChatStream(true, false))
	if allocs := testing.AllocsPerRun(20, func() {
		sink.Reset()
		f.write(sink.Write, stream)
	}); allocs != 0 {
		t.Errorf("filtering whole events allocated %v times", allocs)
	}
}

// FuzzIncludeUsageBody: a rewritten body is valid JSON, the client's body
// with stream_options.include_usage true added, which it did not have.
func FuzzIncludeUsageBody(f *testing.F) {
	for _, seed := range []string{`{"stream":true}`, ` {"stre\u0061m" : true, "a":[1,{"stream_options":2}]} `, `{"stream":true,"stream_options":null}`, `{}`, `[`, `{"stream":true,"stream":false}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		out := includeUsageBody(body)
		if out == nil {
			return
		}
		var client, sent map[string]any
		if err := json.Unmarshal(body, &client); err != nil {
			t.Fatalf("rewrote a body that is not a JSON object: %q", body)
		}
		if err := json.Unmarshal(out, &sent); err != nil {
			t.Fatalf("rewrote %q into invalid JSON %q: %v", body, out, err)
		}
		if _, had := client["stream_options"]; had || client["stream"] != true {
			t.Fatalf("rewrote %q, which has stream_options or does not stream", body)
		}
		client["stream_options"] = map[string]any{"include_usage": true}
		if !reflect.DeepEqual(client, sent) {
			t.Fatalf("rewrote %q into %q", body, out)
		}
	})
}

// FuzzIncludeUsageFilter: a stream filtered whole and cut at two points
// gives the client the same bytes, and nothing panics.
func FuzzIncludeUsageFilter(f *testing.F) {
	f.Add([]byte(openAIChatStream(true, false)), uint16(100), uint16(700))
	f.Add([]byte("data: {\"usage\":null,\"a\":1}\r\n\r\ndata: {\"choices\":[],\"usage\":{}}\n\n"), uint16(3), uint16(30))
	f.Fuzz(func(t *testing.T, stream []byte, a, b uint16) {
		i, j := min(int(a), len(stream)), min(int(b), len(stream))
		i, j = min(i, j), max(i, j)
		whole, _ := filtered(t, "text/event-stream", string(stream))
		cut, _ := filtered(t, "text/event-stream", string(stream), i, j)
		if whole != cut {
			t.Fatalf("cut at %d and %d: %q, whole: %q", i, j, cut, whole)
		}
	})
}
