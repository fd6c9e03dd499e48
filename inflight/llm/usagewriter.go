package llm

import (
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Writer passes a response through unchanged and reads the usage it
// reports. It reads the body only when it can hold usage: a 2xx answer in
// JSON or an SSE stream, not compressed. A gzip (or other encoded) body is
// passed through unread, since inflating it would cost a decompressor per
// response; LLM APIs answer uncompressed unless asked, and a proxy in front
// of one should not ask.
//
// When the request's body was rewritten to ask for the usage report
// (include_usage), an SSE response is filtered too, so that the client gets
// the stream it asked for: see eventFilter.
type Writer struct {
	caddyhttp.ResponseWriterWrapper
	scan      usageScanner
	events    eventFilter
	injected  bool // set before the response: include_usage asked for the report
	reading   bool // decided at the first WriteHeader/Write: the body is read
	filtering bool // decided with reading: the body is an SSE stream to filter
	decided   bool
}

// WriteHeader decides whether the body is read at the final status; a 1xx
// informational answer (100 Continue, 103 Early Hints) is not final.
func (u *Writer) WriteHeader(code int) {
	if !u.decided && (code >= 200 || code == http.StatusSwitchingProtocols) {
		u.decide(code)
	}
	u.ResponseWriter.WriteHeader(code)
}

// Write passes p on, then reads what was written. When filtering, p is
// read first, then passed on filtered as its events end.
func (u *Writer) Write(p []byte) (int, error) {
	if !u.decided {
		u.decide(http.StatusOK)
	}
	if u.filtering {
		u.scan.write(p)
		return u.events.write(u.ResponseWriter.Write, p)
	}
	n, err := u.ResponseWriter.Write(p)
	if u.reading {
		u.scan.write(p[:n])
	}
	return n, err
}

// ReadFrom copies through Write when the body is read: the embedded
// wrapper's ReadFrom would hand r to the underlying writer and bypass it.
func (u *Writer) ReadFrom(r io.Reader) (int64, error) {
	if !u.decided {
		u.decide(http.StatusOK)
	}
	if !u.reading {
		return u.ResponseWriterWrapper.ReadFrom(r)
	}
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	return io.CopyBuffer(writeOnly{u}, r, *buf)
}

// Flush passes through: what it flushes is what was passed on, every
// event that ended when filtering. It sends the headers, so the body's
// reading is decided here if not before.
func (u *Writer) Flush() {
	if !u.decided {
		u.decide(http.StatusOK)
	}
	_ = http.NewResponseController(u.ResponseWriter).Flush()
}

// Begin readies u for the response to a request estimated at e, written
// to w.
func (u *Writer) Begin(w http.ResponseWriter, e Estimate) {
	u.ResponseWriter, u.injected = w, e.injected
}

// End passes on the event a filtered response ended within, once the
// response's writer has returned, and returns the usage the body
// reported, and whether it is final (see usageScanner.usage). A write
// error is not returned: the client left, and the response was answered
// already.
func (u *Writer) End() (TokenUsage, bool) {
	if u.filtering {
		_ = u.events.finish(u.ResponseWriter.Write)
	}
	return u.scan.usage()
}

// Reset readies u for another response, keeping its scanner's buffer:
// nothing of the last response stays reachable.
func (u *Writer) Reset() {
	u.ResponseWriter, u.injected, u.reading, u.filtering, u.decided = nil, false, false, false, false
	u.scan.reset()
	u.events.reset()
}

// decide settles whether the body is read, from the final status and the
// headers going out with it.
func (u *Writer) decide(code int) {
	u.decided = true
	h := u.Header()
	u.reading = code >= 200 && code < 300 && usageMediaType(h.Get("Content-Type")) &&
		(h.Get("Content-Encoding") == "" || strings.EqualFold(strings.TrimSpace(h.Get("Content-Encoding")), "identity"))
	u.filtering = u.reading && u.injected && eventStream(h.Get("Content-Type"))
}

// usageMediaType reports whether a Content-Type is one usage is reported in:
// application/json or text/event-stream, whatever its parameters.
func usageMediaType(contentType string) bool {
	return isMediaType(contentType, "application/json") || eventStream(contentType)
}

// eventStream reports whether a Content-Type is text/event-stream.
func eventStream(contentType string) bool { return isMediaType(contentType, "text/event-stream") }

// isMediaType reports whether contentType is of the media type mt, whatever
// its parameters and case.
func isMediaType(contentType, mt string) bool {
	got, _, _ := strings.Cut(contentType, ";")
	return strings.EqualFold(strings.TrimSpace(got), mt)
}

// writeOnly hides Writer's ReadFrom from io.CopyBuffer, which would
// otherwise call it again.
type writeOnly struct{ io.Writer }

// copyBufs are ReadFrom's copy buffers, reused: a response read for usage
// then costs no 32 KiB allocation.
var copyBufs = sync.Pool{New: func() any {
	b := make([]byte, 32<<10)
	return &b
}}
