package inflight

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddy-inflight/caddy-inflight/inflight/internal/bodytest"
)

// readAll waits until reading ahead has stopped, reports the buffer it
// used, and returns the whole body as the next handler reads it.
func readAll(t *testing.T, wb *waitBody) (body []byte, buffered int, err error) {
	t.Helper()
	<-wb.done
	buffered = cap(wb.Ahead)
	wb.stop.Store(true)
	body, err = io.ReadAll(wb)
	return body, buffered, err
}

func TestWaitBodyShorterThanBound(t *testing.T) {
	for _, length := range []int64{1000, -1} { // Content-Length, chunked
		want := bodytest.Patterned(1000)
		wb := readAhead(io.NopCloser(bytes.NewReader(want)), length, 64<<10)
		got, buffered, err := readAll(t, wb)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("length %d: read %d bytes (%v), want the %d sent", length, len(got), err, len(want))
		}
		if wb.Err != io.EOF {
			t.Fatalf("length %d: reading ahead ended with %v, want the body's end", length, wb.Err)
		}
		if length > 0 && buffered != 1001 {
			t.Fatalf("length %d: buffer of %d bytes, want the length plus one", length, buffered)
		}
	}
}

func TestWaitBodyLongerThanBound(t *testing.T) {
	const limit = 10000
	for _, length := range []int64{1 << 20, -1} {
		want := bodytest.Patterned(1 << 20)
		wb := readAhead(io.NopCloser(bytes.NewReader(want)), length, limit)
		got, buffered, err := readAll(t, wb)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("length %d: read %d bytes (%v), want the %d sent", length, len(got), err, len(want))
		}
		if buffered != limit || wb.Err != nil {
			t.Fatalf("length %d: read ahead into %d bytes, ended with %v; want exactly the bound %d, no end", length, buffered, wb.Err, limit)
		}
	}
}

// A body still coming when the request is admitted: reading ahead stops at
// the latest after the read under way, and the next handler gets every
// byte in order, whichever of them read it.
func TestWaitBodyAdmittedMidBody(t *testing.T) {
	pr, pw := io.Pipe()
	wb := readAhead(pr, -1, 64<<10)
	pw.Write([]byte("first ")) // returns once read ahead
	wb.stop.Store(true)
	go func() {
		pw.Write([]byte("second "))
		pw.Write([]byte("third"))
		pw.Close()
	}()
	got, err := io.ReadAll(wb)
	if err != nil || string(got) != "first second third" {
		t.Fatalf("read %q (%v), want %q", got, err, "first second third")
	}
}

// A client that leaves mid-body: the next reader sees what came, then the
// read error, as it would without reading ahead.
func TestWaitBodyReadError(t *testing.T) {
	gone := errors.New("client gone")
	pr, pw := io.Pipe()
	wb := readAhead(pr, 100, 64<<10)
	pw.Write([]byte("partial"))
	pw.CloseWithError(gone)
	got, _, err := readAll(t, wb)
	if string(got) != "partial" || err != gone {
		t.Fatalf("read %q, %v; want %q, %v", got, err, "partial", gone)
	}
}

// end returns even while a read waits for a client that sends nothing,
// where the response writer cannot set a read deadline.
func TestWaitBodyEndDoesNotHang(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	wb := readAhead(pr, -1, 64<<10)
	wb.end(httptest.NewRecorder())
	if !wb.stop.Load() {
		t.Fatal("end did not stop reading ahead")
	}
}

func TestMustWatchBody(t *testing.T) {
	post := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("x"))
	get := httptest.NewRequest(http.MethodGet, "/", nil)
	h2 := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("x"))
	h2.ProtoMajor = 2
	for _, c := range []struct {
		name string
		r    *http.Request
		want bool
	}{{"HTTP/1.1 POST", post, true}, {"HTTP/1.1 GET", get, false}, {"HTTP/2 POST", h2, false}} {
		if got := mustWatchBody(c.r); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
