package redisstore

import "encoding/binary"

// scriptArgs is a script's arguments written as one msgpack array, its
// only ARGV. Redis hands a script each argument as a string: under a
// million keys, turning them into numbers one by one, and copying them,
// was about a seventh of the call script's time. The cmsgpack library
// Redis bundles with its Lua decodes the array, in C, into numbers and
// strings.
type scriptArgs struct {
	b []byte
	n uint32 // elements so far
}

func newScriptArgs(capacity int) *scriptArgs {
	// The array's header is written last, when its length is known:
	// array 32 (0xdd) and the length, big-endian.
	return &scriptArgs{b: append(make([]byte, 0, capacity), 0xdd, 0, 0, 0, 0)}
}

// int appends v as a fixint (one byte), an int 32 or an int 64.
func (a *scriptArgs) int(v int64) {
	a.n++
	switch {
	case v >= -32 && v < 128: // positive or negative fixint
		a.b = append(a.b, byte(v))
	case v >= -1<<31 && v < 1<<31: // int 32
		a.b = binary.BigEndian.AppendUint32(append(a.b, 0xd2), uint32(v))
	default: // int 64
		a.b = binary.BigEndian.AppendUint64(append(a.b, 0xd3), uint64(v))
	}
}

// flag appends 1 for true, 0 for false.
func (a *scriptArgs) flag(v bool) {
	if v {
		a.int(1)
	} else {
		a.int(0)
	}
}

// str appends s as a str 32.
func (a *scriptArgs) str(s string) {
	a.n++
	a.b = append(binary.BigEndian.AppendUint32(append(a.b, 0xdb), uint32(len(s))), s...)
}

// packed returns the array.
func (a *scriptArgs) packed() string {
	binary.BigEndian.PutUint32(a.b[1:5], a.n)
	return string(a.b)
}
