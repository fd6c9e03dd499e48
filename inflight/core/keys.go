package core

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf8"
)

// redact returns a short stable stand-in for a key that may be secret.
func redact(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "h:" + hex.EncodeToString(sum[:6])
}

// LabelValue returns key as a metric label value, which must be valid
// UTF-8, one to one: a byte that is not valid UTF-8 is written as \xNN and
// a backslash as \\, so no key reads as another; a key that reads as
// overflowKey is written \x5foverflow.
func LabelValue(key string) string {
	if key == overflowKey {
		return `\x5f` + key[1:]
	}
	if utf8.ValidString(key) && !strings.Contains(key, `\`) {
		return key
	}
	var b strings.Builder
	for i := 0; i < len(key); {
		r, size := utf8.DecodeRuneInString(key[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, key[i])
		case r == '\\':
			b.WriteString(`\\`)
		default:
			b.WriteString(key[i : i+size])
		}
		i += size
	}
	return b.String()
}
