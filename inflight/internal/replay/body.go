// Package replay hands a request's body on to the next handler after its
// first bytes were read before it: by the LLM estimate before admission,
// or ahead while the request waits.
package replay

import "io"

// FirstBuffer is the first buffer for reading ahead a body of unknown
// length; it doubles up to the bound as the body comes.
const FirstBuffer = 4 << 10

// Body is a request body whose first bytes were read before the next
// handler: it returns them, then the rest of the body. Close closes the
// request's own body.
type Body struct {
	io.ReadCloser        // the request's own body
	Ahead         []byte // read before, not yet returned
	Err           error  // what ended reading before, if the body did not go on: io.EOF or a read error
}

// Read returns the bytes read before, then the rest of the body.
func (b *Body) Read(p []byte) (int, error) {
	if len(b.Ahead) > 0 {
		n := copy(p, b.Ahead)
		b.Ahead = b.Ahead[n:]
		if len(b.Ahead) == 0 {
			b.Ahead = nil // give the buffer back as soon as it is passed on
		}
		return n, nil
	}
	if b.Err != nil {
		return 0, b.Err
	}
	return b.ReadCloser.Read(p)
}
