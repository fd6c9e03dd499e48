// Package bodytest makes request bodies for the tests of the HTTP edge and
// of the LLM package, and counts what is read of them.
package bodytest

import (
	"io"
	"strings"
)

// Patterned returns n bytes that are not all alike, so that a body handed
// on out of order or with a gap does not read as the one sent.
func Patterned(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}

// Chat returns an OpenAI chat request of exactly size bytes, most of it
// conversation, asking for 256 output tokens at the end.
func Chat(size int) []byte {
	head := `{"model":"gpt-4o","messages":[`
	tail := `{"role":"user","content":"Summarize."}],"max_tokens":256}`
	var msgs strings.Builder
	for msgs.Len() < size-len(head)-len(tail)-200 {
		msgs.WriteString(`{"role":"user","content":"Line \"quoted\" with some text, numbers 12345 and unicode \u00e9."},`)
	}
	pad := size - len(head) - len(tail) - msgs.Len() - len(`{"role":"user","content":""},`)
	msgs.WriteString(`{"role":"user","content":"` + strings.Repeat("a", pad) + `"},`)
	return []byte(head + msgs.String() + tail)
}

// Counting counts the bytes read from R.
type Counting struct {
	R io.Reader
	N int64
}

func (c *Counting) Read(p []byte) (int, error) {
	n, err := c.R.Read(p)
	c.N += int64(n)
	return n, err
}
