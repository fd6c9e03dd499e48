package llm

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/internal/bodytest"
)

// tokensCost returns a TokensCost with its defaults set, but max_body.
func tokensCost(maxBody int64) *TokensCost {
	t := &TokensCost{MaxBody: maxBody}
	t.SetDefaults()
	return t
}

// bodyRequest returns a POST request with body, its Content-Length known
// or not, and the reader counting what is read of it.
func bodyRequest(body []byte, knownLength bool) (*http.Request, *bodytest.Counting) {
	counted := &bodytest.Counting{R: bytes.NewReader(body)}
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", counted)
	r.ContentLength = -1
	if knownLength {
		r.ContentLength = int64(len(body))
	}
	return r, counted
}

func TestTokensFormula(t *testing.T) {
	huge := int64(math.MaxInt64)
	nested := func(depth int) string {
		return `{"a":` + strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1) + `,"max_tokens":9}`
	}
	for _, c := range []struct {
		name, body string
		output     int64 // expected output tokens: the estimate is ceil(len(body)/4) plus this
	}{
		{"openai chat", `{"model":"gpt-4o","messages":[{"role":"user","content":"Hello there"}],"max_completion_tokens":300}`, 300},
		{"openai chat legacy", `{"model":"gpt-4o","messages":[{"role":"user","content":"Hi"}],"max_tokens":77,"stream":true}`, 77},
		{"anthropic messages", `{"model":"claude-sonnet-4-5","max_tokens":4096,"system":"Be brief.","messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}],"metadata":{"user_id":"u1"}}`, 4096},
		{"responses api", `{"model":"gpt-4.1","input":"Tell me a story","max_output_tokens":500}`, 500},
		{"largest of several", `{"max_tokens":100,"max_completion_tokens":2000,"max_output_tokens":50}`, 2000},
		{"none", `{"model":"gpt-4o","messages":[]}`, 1024},
		{"empty object", `{}`, 1024},
		{"whitespace around", " \r\n\t{ \"max_tokens\" : 12 } \n", 12},
		{"zero", `{"max_tokens":0}`, 0},
		{"not json", `hello, world`, 1024},
		{"json array", `[{"max_tokens":5}]`, 1024},
		{"json string", `"max_tokens"`, 1024},
		{"truncated", `{"max_tokens":10,`, 1024},
		{"trailing garbage", `{"max_tokens":10} x`, 1024},
		{"two objects", `{"max_tokens":10}{"max_tokens":20}`, 1024},
		{"nested only", `{"metadata":{"max_tokens":999999},"tools":[{"max_tokens":999999}]}`, 1024},
		{"nested and top level", `{"metadata":{"max_tokens":999999},"max_tokens":3}`, 3},
		{"duplicate, largest last", `{"max_tokens":10,"max_tokens":5000}`, 5000},
		{"duplicate, largest first", `{"max_tokens":5000,"max_tokens":10}`, 5000},
		{"other case", `{"MAX_TOKENS":99999,"Max_Tokens":99999}`, 1024},
		{"escaped key", `{"max\u005ftokens":7777}`, 7777},
		{"escaped other key", `{"max\u005ftokenz":7777}`, 1024},
		{"key with a quote", `{"max_tokens\"":7777}`, 1024},
		{"negative", `{"max_tokens":-5}`, 1024},
		{"negative zero", `{"max_tokens":-0}`, 0},
		{"fraction", `{"max_tokens":1.5}`, 1024},
		{"integral float", `{"max_tokens":2048.0}`, 2048},
		{"exponent", `{"max_tokens":1e3}`, 1000},
		{"negative exponent", `{"max_tokens":15e-1}`, 1024},
		{"string", `{"max_tokens":"500"}`, 1024},
		{"null", `{"max_tokens":null}`, 1024},
		{"true", `{"max_tokens":true}`, 1024},
		{"object", `{"max_tokens":{"max_tokens":5}}`, 1024},
		{"ignored beside a count", `{"max_tokens":"9999999","max_output_tokens":8}`, 8},
		{"leading zero", `{"max_tokens":0123}`, 1024},
		{"beyond int64", `{"max_tokens":99999999999999999999}`, huge},
		{"int64 max", `{"max_tokens":9223372036854775807}`, huge},
		{"int64 max + 1", `{"max_tokens":9223372036854775808}`, huge},
		{"1e30", `{"max_tokens":1e30}`, huge},
		{"beyond float64", `{"max_tokens":1e400}`, huge},
		{"below float64", `{"max_tokens":-1e400}`, 1024},
		{"control character in a string", "{\"a\":\"\x01\",\"max_tokens\":9}", 1024},
		{"bad escape", `{"a":"\x","max_tokens":9}`, 1024},
		{"deep, as deep as encoding/json reads", nested(maxJSONDepth), 9},
		{"deeper than encoding/json reads", nested(maxJSONDepth + 1), 1024},
	} {
		t.Run(c.name, func(t *testing.T) {
			if ref, ok := referenceOutput([]byte(c.body)); !ok && c.output != 1024 || ok && ref != c.output {
				t.Fatalf("encoding/json reads output %d (found %v), the table says %d", ref, ok, c.output)
			}
			for _, known := range []bool{true, false} {
				r, _ := bodyRequest([]byte(c.body), known)
				got, err := costOfBody(tokensCost(0), r)
				want := addTokens(int64(len(c.body)+3)/4, c.output)
				if err != nil || got != want {
					t.Fatalf("Content-Length known %v: estimate %d (%v), want %d", known, got, err, want)
				}
				if rest, err := io.ReadAll(r.Body); err != nil || string(rest) != c.body {
					t.Fatalf("the next handler read %q (%v), want the body %q", rest, err, c.body)
				}
			}
		})
	}
}

func TestTokensNoBody(t *testing.T) {
	for _, r := range []*http.Request{
		httptest.NewRequest(http.MethodGet, "/", nil),
		httptest.NewRequest(http.MethodPost, "/", strings.NewReader("")),
	} {
		if got, err := costOfBody(tokensCost(0), r); err != nil || got != 1024 {
			t.Fatalf("%s with Content-Length %d: estimate %d (%v), want default_output 1024", r.Method, r.ContentLength, got, err)
		}
	}
}

func TestTokensBytesPerToken(t *testing.T) {
	body := []byte(`{"max_tokens":1}`) // 16 bytes
	for _, c := range []struct{ perToken, want int64 }{{1, 17}, {3, 7}, {4, 5}, {16, 2}, {17, 2}, {1000, 2}} {
		r, _ := bodyRequest(body, true)
		tc := &TokensCost{BytesPerToken: c.perToken}
		tc.SetDefaults()
		if got, err := costOfBody(tc, r); err != nil || got != c.want {
			t.Fatalf("bytes_per_token %d: estimate %d (%v), want %d", c.perToken, got, err, c.want)
		}
	}
}

// A body longer than max_body: its first max_body bytes are read, no more,
// and it counts its Content-Length and default_output, or the most there
// is without one. The next handler still reads it whole.
func TestTokensBeyondMaxBody(t *testing.T) {
	const maxBody = 100
	body := []byte(`{"max_tokens":5,"messages":"` + strings.Repeat("x", 1000) + `"}`)
	for _, c := range []struct {
		name    string
		known   bool
		want    int64
		readMax int64
	}{
		{"Content-Length", true, int64(len(body)+3)/4 + 1024, maxBody},
		{"chunked", false, math.MaxInt64, maxBody + 1},
	} {
		r, counted := bodyRequest(body, c.known)
		got, err := costOfBody(tokensCost(maxBody), r)
		if err != nil || got != c.want {
			t.Fatalf("%s: estimate %d (%v), want %d", c.name, got, err, c.want)
		}
		if counted.N > c.readMax {
			t.Fatalf("%s: %d bytes read before the next handler, want at most %d", c.name, counted.N, c.readMax)
		}
		if rest, err := io.ReadAll(r.Body); err != nil || !bytes.Equal(rest, body) {
			t.Fatalf("%s: the next handler read %d bytes (%v), want the %d sent", c.name, len(rest), err, len(body))
		}
	}
	// Exactly max_body bytes, length unknown: read whole, counted as usual.
	exact := []byte(`{"max_tokens":5,"m":"` + strings.Repeat("x", maxBody-23) + `"}`)
	r, _ := bodyRequest(exact, false)
	if got, err := costOfBody(tokensCost(maxBody), r); err != nil || got != maxBody/4+5 {
		t.Fatalf("chunked body of exactly max_body: estimate %d (%v), want %d", got, err, maxBody/4+5)
	}
}

func TestTokensValidate(t *testing.T) {
	tc := &TokensCost{}
	tc.SetDefaults()
	if *tc != (TokensCost{BytesPerToken: 4, DefaultOutput: 1024, MaxBody: 1 << 20}) || tc.Check() != nil {
		t.Fatalf("defaults %+v (%v), want 4, 1024, 1 MiB", *tc, tc.Check())
	}
	for _, c := range []struct {
		tc   TokensCost
		want string
	}{
		{TokensCost{BytesPerToken: -1}, "inflight: cost tokens: bytes_per_token -1 is not allowed: want a positive integer"},
		{TokensCost{DefaultOutput: -5}, "inflight: cost tokens: default_output -5 is not allowed: want a positive integer"},
		{TokensCost{MaxBody: -1}, "inflight: cost tokens: max_body -1 is not allowed: want 1 to 1073741824 bytes"},
		{TokensCost{MaxBody: 1<<30 + 1}, "inflight: cost tokens: max_body 1073741825 is not allowed: want 1 to 1073741824 bytes"},
	} {
		c.tc.SetDefaults()
		if err := c.tc.Check(); err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Fatalf("%+v: %v, want %q", c.tc, err, c.want)
		}
	}
}

// estimateThenHash is a handler that estimates a request's cost, then
// reads its body as the next handler would, and answers with the estimate
// and the body's SHA-256.
func estimateThenHash(tc *TokensCost) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		cost, err := costOfBody(tc, r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		h := sha256.New()
		if _, err := io.Copy(h, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d %x", cost, h.Sum(nil))
	}
}

// The backend reads every byte the client sent, in order, over HTTP/1.1
// and HTTP/2, with and without a Content-Length, below and above max_body.
func TestTokensBodyReachesNextHandler(t *testing.T) {
	tc := tokensCost(0)
	h1 := httptest.NewServer(estimateThenHash(tc))
	defer h1.Close()
	h2 := httptest.NewUnstartedServer(estimateThenHash(tc))
	h2.EnableHTTP2 = true
	h2.StartTLS()
	defer h2.Close()

	small := []byte(`{"model":"m","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`)
	big := bodytest.Patterned(3 << 20)
	for _, server := range []struct {
		name  string
		srv   *httptest.Server
		major int
	}{{"HTTP/1.1", h1, 1}, {"HTTP/2", h2, 2}} {
		for _, c := range []struct {
			name  string
			body  []byte
			known bool
			cost  int64
		}{
			{"small", small, true, int64(len(small)+3)/4 + 64},
			{"small chunked", small, false, int64(len(small)+3)/4 + 64},
			{"3 MiB", big, true, int64(len(big))/4 + 1024},
			{"3 MiB chunked", big, false, math.MaxInt64},
		} {
			t.Run(server.name+" "+c.name, func(t *testing.T) {
				var body io.Reader = bytes.NewReader(c.body)
				if !c.known {
					body = io.MultiReader(body) // hides the length: sent chunked
				}
				req, _ := http.NewRequest(http.MethodPost, server.srv.URL, body)
				resp, err := server.srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				checkEstimateAndBody(t, resp, server.major, c.cost, c.body)
			})
		}
	}
}

func checkEstimateAndBody(t *testing.T, resp *http.Response, major int, cost int64, sent []byte) {
	t.Helper()
	answer, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, %q (%v)", resp.StatusCode, answer, err)
	}
	if resp.ProtoMajor != major {
		t.Fatalf("served over %s, want HTTP/%d", resp.Proto, major)
	}
	sum := sha256.Sum256(sent)
	want := strconv.FormatInt(cost, 10) + " " + hex.EncodeToString(sum[:])
	if string(answer) != want {
		t.Fatalf("backend saw %q, want estimate and SHA-256 %q", answer, want)
	}
}

// With Expect: 100-continue the client sends the body only once the server
// asks for it, which Go's server does when the body is first read: by the
// estimate.
func TestTokensExpectContinue(t *testing.T) {
	srv := httptest.NewServer(estimateThenHash(tokensCost(0)))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: time.Minute}} // no verdict on time: it only must not send before
	defer client.CloseIdleConnections()
	for _, size := range []int{100, 3 << 20} {
		body := bodytest.Patterned(size)
		var got100 bool
		trace := &httptrace.ClientTrace{Got100Continue: func() { got100 = true }}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), http.MethodPost, srv.URL, bytes.NewReader(body))
		req.Header.Set("Expect", "100-continue")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		checkEstimateAndBody(t, resp, 1, int64(size+3)/4+1024, body)
		resp.Body.Close()
		if !got100 {
			t.Fatalf("%d bytes: the client got no 100 Continue", size)
		}
	}
}

// A client that leaves mid-body: the estimate returns an error, at once.
func TestTokensClientLeavesMidBody(t *testing.T) {
	errs := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := costOfBody(tokensCost(0), r)
		errs <- err
	}))
	defer srv.Close()
	for _, head := range []string{
		"Content-Length: 1000\r\n\r\n" + strings.Repeat("x", 100),
		"Transfer-Encoding: chunked\r\n\r\n3e8\r\n" + strings.Repeat("x", 100),
	} {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: example.com\r\n%s", head)
		conn.Close()
		select {
		case err := <-errs:
			if err == nil || !strings.HasPrefix(err.Error(), "inflight: reading the body: ") || !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("%q: estimate returned %v, want the read error", head[:20], err)
			}
		case <-time.After(20 * time.Second): // a generous bound: it must not hang
			t.Fatalf("%q: the estimate still waits for a client that left", head[:20])
		}
	}
}

// The body read in small pieces, as it comes off the network, with a
// read error after them.
func TestTokensReadErrorKeptForNextHandler(t *testing.T) {
	broken := errors.New("connection reset")
	body := `{"max_tokens":1}`
	r := httptest.NewRequest(http.MethodPost, "/", io.MultiReader(iotest.OneByteReader(strings.NewReader(body)), iotest.ErrReader(broken)))
	r.ContentLength = -1
	if _, err := costOfBody(tokensCost(0), r); !errors.Is(err, broken) {
		t.Fatalf("estimate returned %v, want the read error", err)
	}
	got, err := io.ReadAll(bufio.NewReader(r.Body))
	if string(got) != body || !errors.Is(err, broken) {
		t.Fatalf("the next handler read %q, %v; want %q, then the read error", got, err, body)
	}
}

// referenceOutput is the output readFields reads, by encoding/json:
// json.Valid, then a token walk of the top-level object.
func referenceOutput(body []byte) (output int64, ok bool) {
	if !json.Valid(body) {
		return 0, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if tok, _ := dec.Token(); tok != json.Delim('{') {
		return 0, false
	}
	for dec.More() {
		key, _ := dec.Token()
		var value json.RawMessage
		dec.Decode(&value)
		switch key {
		case "max_tokens", "max_completion_tokens", "max_output_tokens":
			if n, isCount := tokenCount(value); isCount {
				output, ok = max(output, n), true
			}
		}
	}
	return output, ok
}

// FuzzTokensEstimate estimates hostile bodies and reads their model:
// nothing panics, the estimate follows the formula and the model is the
// top-level one (with encoding/json as the reference for the JSON; a body
// over max_body has the model _unknown), and the next handler reads the
// body byte for byte.
func FuzzTokensEstimate(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"user","content":"{\"model\":\"b\"}","model":"c"}],"model":"a","model":"d"}`,
		`{"mod\u0065l":"\u00e9\ud83d\ude00","metadata":{"model":"x"},"MODEL":"y","model":""}`,
		`{"model":1,"model":null}`, "{\"model\":\"\xff\"}",
		`{"max_completion_tokens":10,"max_output_tokens":1e3,"max_tokens":2048.0}`,
		`{"max_tokens":99999999999999999999,"max_tokens":-1,"a":{"max_tokens":5}}`,
		`{"max\u005ftokens":7,"MAX_TOKENS":9,"x":[[[{"y":"\"}"}]]]}`,
		`[1,2]`, `not json`, ``, `{"max_tokens":1.5e400}`, "{\"a\":\"\xff\xfe\"}",
	} {
		f.Add([]byte(seed), true, uint16(0))
		f.Add([]byte(seed), false, uint16(16))
	}
	f.Fuzz(func(t *testing.T, body []byte, known bool, maxBody uint16) {
		tc := tokensCost(int64(maxBody))
		r, _ := bodyRequest(body, known)
		if !known {
			r.Body = io.NopCloser(iotest.HalfReader(r.Body)) // short reads, as off the network
		}
		read, err := ReadBody(r, tc.MaxBody)
		if err != nil {
			t.Fatalf("reading the body: %v", err)
		}
		got := tc.estimate(r, &read, tc.DefaultOutput, 0).Cost
		n := int64(len(body))
		wantModel := UnknownModel
		if n <= tc.MaxBody {
			wantModel = referenceModel(body)
		}
		if model := read.fields.model; model != wantModel {
			t.Fatalf("model %q, want %q", model, wantModel)
		}
		want := addTokens((n+3)/4, tc.DefaultOutput)
		switch {
		case n > tc.MaxBody && !known:
			want = math.MaxInt64
		case n <= tc.MaxBody:
			if output, ok := referenceOutput(body); ok {
				want = addTokens((n+3)/4, output)
			}
		}
		if got != want || got < (n+3)/4 {
			t.Fatalf("estimate %d, want %d", got, want)
		}
		if rest, err := io.ReadAll(r.Body); err != nil || !bytes.Equal(rest, body) {
			t.Fatalf("the next handler read %q (%v), want %q", rest, err, body)
		}
	})
}

func BenchmarkTokensEstimate(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10, 1 << 20} {
		b.Run(strconv.Itoa(size>>10)+"KiB", func(b *testing.B) {
			body := bodytest.Chat(size)
			tc := tokensCost(0)
			reader := bytes.NewReader(body)
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", reader)
			own := io.NopCloser(reader)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				reader.Reset(body)
				r.Body = own
				if cost, err := costOfBody(tc, r); err != nil || cost != int64(size)/4+256 {
					b.Fatalf("estimate %d (%v)", cost, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(size>>10), "ns/KiB")
		})
	}
}

// estimateRequest reads r's body as the handler does, and returns t's
// estimate of it.
func estimateRequest(t *TokensCost, r *http.Request, defaultOutput, learned int64) (Estimate, error) {
	body, err := ReadBody(r, t.MaxBody)
	if err != nil {
		return Estimate{}, err
	}
	return t.estimate(r, &body, defaultOutput, learned), nil
}

// costOfBody is t's estimate of r's cost, with its own default output.
func costOfBody(t *TokensCost, r *http.Request) (int64, error) {
	est, err := estimateRequest(t, r, t.DefaultOutput, 0)
	return est.Cost, err
}

// TestTokensLearnedOutput: once an output estimate is learnt, a body
// naming no output counts it, and one naming more counts it too (its
// max_tokens is a ceiling, not an estimate), while one naming less counts
// its own; only requests whose output was free up to default_output at
// least teach the estimate.
func TestTokensLearnedOutput(t *testing.T) {
	for _, c := range []struct {
		body    string
		want    int64
		teaches bool
	}{
		{`{"messages":[]}`, 4 + 300, true},                   // 15 bytes
		{`{"max_tokens":4096,"messages":[]}`, 9 + 300, true}, // 33 bytes
		{`{"max_tokens":1024,"messages":[]}`, 9 + 300, true},
		{`{"max_tokens":1000,"messages":[]}`, 9 + 300, false},
		{`{"max_tokens":256,"messages":[]}`, 8 + 256, false}, // 32 bytes
	} {
		r := httptest.NewRequest("POST", "/", strings.NewReader(c.body))
		est, err := estimateRequest(tokensCost(0), r, 300, 300)
		if err != nil || est.Cost != c.want || est.teaches != c.teaches {
			t.Errorf("%s, learned 300: cost %d, teaches %v (%v); want %d, %v", c.body, est.Cost, est.teaches, err, c.want, c.teaches)
		}
	}
	// Until learnt (learned 0), a named output counts whole.
	r := httptest.NewRequest("POST", "/", strings.NewReader(`{"max_tokens":4096,"messages":[]}`))
	if est, err := estimateRequest(tokensCost(0), r, 1024, 0); err != nil || est.Cost != 9+4096 {
		t.Errorf("max_tokens 4096, nothing learnt: cost %d (%v), want %d", est.Cost, err, 9+4096)
	}
}
