package llm

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// recordingWriter records what reaches the client's writer, including the
// informational statuses and flushes httptest.ResponseRecorder drops, and
// whether its ReadFrom was used.
type recordingWriter struct {
	header   http.Header
	codes    []int
	body     bytes.Buffer
	flushes  int
	readFrom bool
}

func (w *recordingWriter) Header() http.Header         { return w.header }
func (w *recordingWriter) WriteHeader(code int)        { w.codes = append(w.codes, code) }
func (w *recordingWriter) Write(p []byte) (int, error) { return w.body.Write(p) }
func (w *recordingWriter) Flush()                      { w.flushes++ }
func (w *recordingWriter) ReadFrom(r io.Reader) (int64, error) {
	w.readFrom = true
	return w.body.ReadFrom(r)
}

// newWriter wraps a recordingWriter whose response has the headers.
func newWriter(headers ...string) (*Writer, *recordingWriter) {
	rec := &recordingWriter{header: http.Header{}}
	for i := 0; i+1 < len(headers); i += 2 {
		rec.header.Set(headers[i], headers[i+1])
	}
	return &Writer{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: rec}}, rec
}

// TestUsageWriterReads writes bodies in pieces and by ReadFrom: they reach
// the client unchanged and their usage is read.
func TestUsageWriterReads(t *testing.T) {
	body := openAIChatStream(true, false)
	u, rec := newWriter("Content-Type", "Text/Event-Stream; charset=utf-8", "Content-Encoding", "identity")
	u.WriteHeader(http.StatusEarlyHints)
	u.WriteHeader(http.StatusOK)
	for i := 0; i < len(body); i += 100 {
		if n, err := u.Write([]byte(body[i:min(i+100, len(body))])); err != nil || n != min(100, len(body)-i) {
			t.Fatalf("Write: %d, %v", n, err)
		}
		u.Flush()
	}
	if rec.body.String() != body || len(rec.codes) != 2 || rec.codes[1] != http.StatusOK || rec.flushes == 0 {
		t.Fatalf("the response changed: codes %v, %d flushes, body equal %v", rec.codes, rec.flushes, rec.body.String() == body)
	}
	if got, final := u.scan.usage(); got != (reported(19, 14, 0)) || !final {
		t.Errorf("streamed: got %+v, %v", got, final)
	}

	u, rec = newWriter("Content-Type", "application/json")
	n, err := u.ReadFrom(strings.NewReader(anthropicJSON))
	if err != nil || n != int64(len(anthropicJSON)) || rec.body.String() != anthropicJSON || rec.readFrom {
		t.Fatalf("ReadFrom: %d, %v, body equal %v, bypassed %v", n, err, rec.body.String() == anthropicJSON, rec.readFrom)
	}
	if got, final := u.scan.usage(); got != (reported(6156, 96, 4096)) || !final {
		t.Errorf("ReadFrom: got %+v, %v", got, final)
	}
}

// TestUsageWriterIgnores checks the bodies not read: an error, another
// type, a compressed one. Each still reaches the client unchanged, and a
// ReadFrom goes to the client's writer.
func TestUsageWriterIgnores(t *testing.T) {
	for _, c := range []struct {
		name    string
		code    int
		headers []string
	}{
		{"500", http.StatusInternalServerError, []string{"Content-Type", "application/json"}},
		{"429", http.StatusTooManyRequests, []string{"Content-Type", "application/json"}},
		{"text/plain", http.StatusOK, []string{"Content-Type", "text/plain; charset=utf-8"}},
		{"no type", http.StatusOK, nil},
		{"application/jsonl", http.StatusOK, []string{"Content-Type", "application/jsonl"}},
		{"gzip", http.StatusOK, []string{"Content-Type", "application/json", "Content-Encoding", "gzip"}},
	} {
		for _, readFrom := range []bool{false, true} {
			u, rec := newWriter(c.headers...)
			u.WriteHeader(c.code)
			if readFrom {
				_, _ = u.ReadFrom(strings.NewReader(anthropicJSON))
			} else {
				_, _ = u.Write([]byte(anthropicJSON))
			}
			if got, final := u.scan.usage(); got != (TokenUsage{}) || final || u.reading {
				t.Errorf("%s: read %+v, %v", c.name, got, final)
			}
			if rec.body.String() != anthropicJSON || rec.readFrom != readFrom || rec.codes[0] != c.code {
				t.Errorf("%s: the response changed (ReadFrom %v passed on: %v)", c.name, readFrom, rec.readFrom)
			}
		}
	}
}

// TestUsageWriterDecidesOnce reads a body whose headers changed after the
// first Write, as they cannot on the wire: the decision stands.
func TestUsageWriterDecidesOnce(t *testing.T) {
	u, _ := newWriter("Content-Type", "text/html")
	_, _ = u.Write([]byte("<p>"))
	u.Header().Set("Content-Type", "application/json")
	u.WriteHeader(http.StatusOK)
	_, _ = u.Write([]byte(anthropicJSON))
	if _, final := u.scan.usage(); final || u.reading {
		t.Error("the body was read after the headers went out as text/html")
	}
}

// TestUsageWriterUnwraps reaches the client's writer through
// http.ResponseController, which finds it by Unwrap.
func TestUsageWriterUnwraps(t *testing.T) {
	u, rec := newWriter("Content-Type", "application/json")
	if err := http.NewResponseController(u).Flush(); err != nil || rec.flushes != 1 {
		t.Fatalf("Flush: %v, %d flushes", err, rec.flushes)
	}
	if u.Unwrap() != http.ResponseWriter(rec) {
		t.Fatal("Unwrap does not give the client's writer")
	}
	if _, _, err := http.NewResponseController(u).Hijack(); err == nil {
		t.Fatal("Hijack succeeded on a writer that cannot")
	}
	u = &Writer{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: hijackable{httptest.NewRecorder()}}}
	if _, _, err := http.NewResponseController(u).Hijack(); err != nil {
		t.Fatalf("Hijack did not reach a writer that can: %v", err)
	}
}

// hijackable is a writer that can be hijacked.
type hijackable struct{ *httptest.ResponseRecorder }

func (hijackable) Hijack() (net.Conn, *bufio.ReadWriter, error) { return nil, nil, nil }
