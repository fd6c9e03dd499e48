package llm

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddy-inflight/caddy-inflight/inflight/internal/replay"
)

// includeUsageOption is what the body rewrite inserts: the request's
// stream then ends with a chunk reporting its usage.
const includeUsageOption = `"stream_options":{"include_usage":true}`

// maxHeldEvent bounds the bytes of one SSE event held to filter it: an
// event longer is passed on unfiltered, and the rest of its response too.
const maxHeldEvent = 64 << 10

// keptEventBuffer is the largest event buffer kept with a pooled writer for
// its next response; a bigger one is dropped.
const keptEventBuffer = 4 << 10

// includeUsage rewrites r's body, read whole as read, to ask for the usage
// report when include_usage applies to it (see TokensCost.IncludeUsage),
// and reports whether it did. The new body replaces r.Body, its length
// r.ContentLength and the Content-Length header when the request had one
// (a body sent chunked stays chunked).
func includeUsage(r *http.Request, read []byte, rest *replay.Body) bool {
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/completions") {
		return false
	}
	body := includeUsageBody(read)
	if body == nil {
		return false
	}
	rest.Ahead = body
	if r.ContentLength >= 0 {
		r.ContentLength = int64(len(body))
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
	return true
}

// includeUsageBody returns body with `"stream_options":{"include_usage":true}`
// inserted as its first member if it is a JSON object whose top-level
// "stream" (its last, if given twice, as the backends' decoders keep it) is
// true and which has no top-level "stream_options" whatever its value; nil
// otherwise. Keys are read as the backends read them: an escaped
// "stre\u0061m" is "stream".
func includeUsageBody(body []byte) []byte {
	stream, options, members := false, false, 0
	valid := objectMembers(body, func(m jsonMember) {
		members++
		switch string(keyName(body[m.key:m.value-m.colon], len("stream_options"))) {
		case "stream":
			stream = string(body[m.value:m.end]) == "true"
		case "stream_options":
			options = true
		}
	})
	if !valid || !stream || options {
		return nil
	}
	open := bytes.IndexByte(body, '{') + 1
	out := make([]byte, 0, len(body)+len(includeUsageOption)+1)
	out = append(out, body[:open]...)
	out = append(out, includeUsageOption...)
	if members > 0 {
		out = append(out, ',')
	}
	return append(out, body[open:]...)
}

// eventFilter gives a client the stream it would have had had include_usage
// not asked for the usage report: each SSE event is held until it ends (a
// blank line), then passed on without the report's chunk, and without the
// `"usage":null` member the other chunks carry. Bytes are copied only while
// an event is cut across writes.
type eventFilter struct {
	held     []byte // the current event's bytes, when cut across writes
	line     uint8  // the current line so far: lineEmpty, lineCR or lineText
	overflow bool   // an event outgrew maxHeldEvent: the rest passes unfiltered
}

// What the current line holds so far: a line holding nothing or a lone CR
// before its LF is blank, and ends the event.
const (
	lineEmpty = iota
	lineCR
	lineText
)

// write passes p on through out, whole events filtered, and holds the
// event p ends within. It returns the bytes of p accepted: all of them
// unless out failed.
func (f *eventFilter) write(out writeFunc, p []byte) (int, error) {
	accepted := 0
	for len(p) > 0 {
		if f.overflow {
			n, err := out(p)
			return accepted + n, err
		}
		end := f.eventEnd(p)
		if end < 0 || len(f.held)+end > maxHeldEvent {
			if len(f.held)+len(p) <= maxHeldEvent && end < 0 {
				f.hold(p)
				return accepted + len(p), nil
			}
			// Too long to hold: what is held, then everything, unfiltered.
			f.overflow = true
			if err := f.flushHeld(out); err != nil {
				return accepted, err
			}
			continue
		}
		event := p[:end]
		if len(f.held) > 0 {
			f.hold(event)
			event = f.held
		}
		err := writeFiltered(out, event)
		f.held = f.held[:0]
		if err != nil {
			return accepted, err
		}
		accepted += end
		p = p[end:]
	}
	return accepted, nil
}

// hold appends p to the held event, whose length stays within
// maxHeldEvent, and so does its buffer.
func (f *eventFilter) hold(p []byte) {
	if need := len(f.held) + len(p); need > cap(f.held) {
		grown := make([]byte, len(f.held), min(max(2*cap(f.held), need, 1024), maxHeldEvent))
		copy(grown, f.held)
		f.held = grown
	}
	f.held = append(f.held, p...)
}

// finish passes on, filtered, the event the response ended within: a
// stream cut short, or one whose last event has no blank line after it.
func (f *eventFilter) finish(out writeFunc) error {
	if len(f.held) == 0 {
		return nil
	}
	err := writeFiltered(out, f.held)
	f.held = f.held[:0]
	return err
}

// flushHeld passes on what is held, unfiltered.
func (f *eventFilter) flushHeld(out writeFunc) error {
	if len(f.held) == 0 {
		return nil
	}
	_, err := out(f.held)
	f.held = f.held[:0]
	return err
}

// reset readies f for another response, keeping a small buffer.
func (f *eventFilter) reset() {
	held := f.held[:0]
	if cap(held) > keptEventBuffer {
		held = nil
	}
	*f = eventFilter{held: held}
}

// eventEnd returns how many bytes of p end the current event, the blank
// line included (\n\n, \r\n\r\n, \n\r\n), or -1 if it goes on after p.
func (f *eventFilter) eventEnd(p []byte) int {
	i := 0
	for {
		nl := bytes.IndexByte(p[i:], '\n')
		if nl < 0 {
			f.line = lineState(f.line, p[i:])
			return -1
		}
		blank := lineState(f.line, p[i:i+nl]) != lineText
		f.line = lineEmpty
		i += nl + 1
		if blank {
			return i
		}
	}
}

// lineState is the state of a line in state once seg is added to it.
func lineState(state uint8, seg []byte) uint8 {
	switch {
	case len(seg) == 0:
		return state
	case state == lineEmpty && len(seg) == 1 && seg[0] == '\r':
		return lineCR
	}
	return lineText
}

// writeFunc writes to the client.
type writeFunc func([]byte) (int, error)

// writeFiltered passes on one whole event: nothing if its data is the
// usage report's chunk (top-level "choices":[] and a "usage" that is not
// null), without its top-level "usage":null member (and the comma that
// joins it) if it has one, else unchanged. Only an event with one data
// line is read; an event of other lines, [DONE], or data that is not one
// JSON object passes unchanged.
func writeFiltered(out writeFunc, event []byte) error {
	from, to, drop := usageMember(event)
	switch {
	case drop:
		return nil
	case from == to:
		_, err := out(event)
		return err
	}
	if _, err := out(event[:from]); err != nil {
		return err
	}
	_, err := out(event[to:])
	return err
}

// usageMember returns the bytes of event to remove, event[from:to] (none
// if from == to), or drop if the whole event is to go.
func usageMember(event []byte) (from, to int, drop bool) {
	data, at, ok := dataLine(event)
	if !ok {
		return 0, 0, false
	}
	var (
		usages, members int
		emptyChoices    bool
		usage           jsonMember
		prevEnd         = -1 // the end of the value before usage; -1 if it is first
		nextKey         = -1 // the start of the key after usage
		lastEnd         int
	)
	valid := objectMembers(data, func(m jsonMember) {
		members++
		if usages == 1 && nextKey < 0 {
			nextKey = m.key
		}
		switch string(keyName(data[m.key:m.value-m.colon], len("choices"))) {
		case "usage":
			usages++
			usage = m
			if members > 1 {
				prevEnd = lastEnd
			}
		case "choices":
			v := data[m.value:m.end]
			emptyChoices = v[0] == '[' && len(bytes.TrimLeft(v[1:], " \t\r\n")) == 1
		}
		lastEnd = m.end
	})
	if !valid || usages != 1 {
		return 0, 0, false
	}
	if string(data[usage.value:usage.end]) != "null" {
		return 0, 0, emptyChoices
	}
	switch {
	case prevEnd >= 0: // `,"usage":null` from the value before it
		return at + prevEnd, at + usage.end, false
	case nextKey >= 0: // `"usage":null,` up to the next key
		return at + usage.key, at + nextKey, false
	}
	return at + usage.key, at + usage.end, false // the only member
}

// dataLine returns the value of event's one data line (after "data:" and
// its optional space, before its line end), and where it starts in event;
// false if event has no data line or more than one.
func dataLine(event []byte) (data []byte, at int, ok bool) {
	for i := 0; i < len(event); {
		end := bytes.IndexByte(event[i:], '\n')
		if end < 0 {
			end = len(event)
		} else {
			end += i
		}
		line := bytes.TrimSuffix(event[i:end], []byte("\r"))
		if bytes.HasPrefix(line, []byte("data:")) {
			if ok {
				return nil, 0, false
			}
			start := i + len("data:")
			if start < len(event) && event[start] == ' ' {
				start++
			}
			data, at, ok = event[start:i+len(line)], start, true
		}
		i = end + 1
	}
	return data, at, ok
}
