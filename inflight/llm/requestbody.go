package llm

import (
	"fmt"
	"io"
	"net/http"

	"github.com/caddy-inflight/caddy-inflight/inflight/internal/replay"
)

// Body is the first bytes of a request's body, read before the request
// is admitted, by cost tokens and for {http.inflight.model}; the request's
// body then hands them on to the next handler, then the rest.
type Body struct {
	// read is the bytes read: at most maxBody, maxBody+1 when the length
	// is unknown, to tell a body that ends at maxBody from a longer one.
	read []byte
	// present tells that the request has a body; whole that it was read
	// to its end (its Content-Length, or its EOF within maxBody); over
	// that it is longer than maxBody, so its JSON is not read.
	present, whole, over bool
	// replay is the request's body now.
	replay *replay.Body
	// fields are what the body names, read if it is not over maxBody.
	fields requestFields
}

// Model is the model the body names (see modelOf), UnknownModel if none
// can be read.
func (b *Body) Model() string { return b.fields.model }

// ReadBody reads r's body, at most maxBody bytes (maxBody+1 when its length
// is unknown), and its fields (readFields) if it is not longer, and puts it
// back so that the next handler reads it byte for byte. A read error (the
// client left mid-body, a request_body max_size exceeded) is returned
// wrapped; the body then returns the bytes read, then that error.
//
// The bytes read are in a buffer of their own, exactly the Content-Length
// when it is below maxBody, and not pooled: r.Body holds it until the next
// handler has read it, and no point in the handler knows when that is
// (http.RoundTripper may read and close a request body in a goroutine of
// its own even after RoundTrip returned), so a buffer put back in a pool
// could still be read. r.Body drops it once it is read.
func ReadBody(r *http.Request, maxBody int64) (Body, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return Body{fields: requestFields{model: UnknownModel}}, nil
	}
	length := r.ContentLength
	limit, size := maxBody+1, min(replay.FirstBuffer, maxBody+1) // one byte more shows where it ends
	if length >= 0 {
		limit = min(length, maxBody)
		size = limit
	}
	read, err := readPrefix(r.Body, size, limit)
	rest := &replay.Body{ReadCloser: r.Body, Ahead: read, Err: err}
	r.Body = rest
	b := Body{read: read, present: true, replay: rest}
	if err != nil && err != io.EOF {
		return b, fmt.Errorf("inflight: reading the body: %w", err)
	}
	b.over = length > maxBody || int64(len(read)) > maxBody
	b.whole = length < 0 && err == io.EOF || length >= 0 && int64(len(read)) == length
	if b.over {
		b.fields = requestFields{model: UnknownModel}
	} else {
		b.fields = readFields(read)
	}
	return b, nil
}

// readPrefix reads body until its end or limit bytes, into a buffer of size
// bytes first, doubled as the body comes. It returns io.EOF if the body
// ended before limit.
func readPrefix(body io.Reader, size, limit int64) ([]byte, error) {
	buf := make([]byte, 0, size)
	for int64(len(buf)) < limit {
		if len(buf) == cap(buf) {
			grown := make([]byte, len(buf), min(2*int64(cap(buf)), limit))
			copy(grown, buf)
			buf = grown
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}
