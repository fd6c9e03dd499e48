package inflight

import (
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/internal/replay"
)

// DefaultWaitBodyBuffer is how much of a waiting request's body is read
// ahead while it waits, unless `wait_body_buffer` says otherwise.
const DefaultWaitBodyBuffer = 64 << 10

// mustWatchBody reports whether a waiting request's client can leave
// unnoticed unless its body is read: an HTTP/1.x request with a body.
//
// Go's HTTP/1.x server notices that a client closed its connection, and
// cancels r.Context(), only while something reads the connection: a handler
// reading the body, or the server's own background read, which starts once
// the body has been read to its end (net/http server.go: registerOnHitEOF
// hooks startBackgroundRead to the body's EOF). HTTP/2 needs no help: its
// connection reader cancels a stream's context on RST_STREAM or when the
// connection ends, whether the body is read or not.
func mustWatchBody(r *http.Request) bool {
	return r.ProtoMajor == 1 && r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody
}

// bodyWatch is the part of a request's admission that watches its client
// while it waits.
type bodyWatch struct {
	r     *http.Request
	limit int       // bound on the bytes read ahead
	body  *waitBody // set once the request is queued
}

// start reads the request's body ahead while it waits.
func (bw *bodyWatch) start() {
	bw.body = readAhead(bw.r.Body, bw.r.ContentLength, bw.limit)
}

// waitBody is the body of a request that waited: what was read ahead while
// it waited, then the rest of the request's own body.
//
// Reading ahead ends at the body's end (from then on net/http watches the
// connection and cancels the request's context when the client leaves), at
// a read error (the client left mid-body; net/http cancels the context as
// well), or when limit bytes are buffered: the rest of a longer body stays
// unread, its client held by TCP flow control, and its leaving is noticed
// only when the request's wait ends, as without reading ahead.
//
// Once the request is admitted (stop), no new read ahead starts. Read waits
// at most for the read under way, whose bytes are the body's next ones
// anyway, so a stream that sends a little and waits for an answer is not
// held up.
type waitBody struct {
	// Body's Ahead and Err are written before done is closed, read
	// after: the bytes read ahead, and what ended reading ahead, if not
	// the bound.
	replay.Body
	stop atomic.Bool   // read no further ahead
	done chan struct{} // closed when reading ahead has ended
}

// readAhead starts reading body ahead into a buffer of at most limit bytes:
// exactly the body's length plus one (to see its end) when that is less,
// else grown by doubling as the body comes.
func readAhead(body io.ReadCloser, length int64, limit int) *waitBody {
	b := &waitBody{Body: replay.Body{ReadCloser: body}, done: make(chan struct{})}
	size := min(replay.FirstBuffer, limit)
	if length > 0 {
		size = int(min(length+1, int64(limit)))
	}
	go b.fill(make([]byte, 0, size), limit)
	return b
}

func (b *waitBody) fill(buf []byte, limit int) {
	defer close(b.done)
	for !b.stop.Load() {
		if len(buf) == cap(buf) {
			if cap(buf) >= limit {
				break
			}
			grown := make([]byte, len(buf), min(2*cap(buf), limit))
			copy(grown, buf)
			buf = grown
		}
		n, err := b.ReadCloser.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil {
			b.Err = err
			break
		}
	}
	b.Ahead = buf
}

// Read returns the bytes read ahead, then the rest of the body.
func (b *waitBody) Read(p []byte) (int, error) {
	<-b.done
	return b.Body.Read(p)
}

// end stops reading ahead and returns once it has stopped: a body must not
// be read once its handler has returned. A read waiting for a client that
// sends nothing more is cut short with a read deadline in the past.
func (b *waitBody) end(w http.ResponseWriter) {
	b.stop.Store(true)
	select {
	case <-b.done:
		return
	default:
	}
	if err := http.NewResponseController(w).SetReadDeadline(time.Now()); err != nil {
		return // cannot cut it short: it ends when the server closes the body
	}
	<-b.done
}
