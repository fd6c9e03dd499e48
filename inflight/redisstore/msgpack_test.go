package redisstore

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestScriptArgsDecodeInRedis packs numbers at each boundary of
// scriptArgs' encodings, flags and strings, and has Redis's Lua decode
// them (cmsgpack) and hand each back, as the call script reads them.
func TestScriptArgsDecodeInRedis(t *testing.T) {
	_, cli := startRedis(t)
	ints := []int64{0, 1, 127, 128, 255, 256, 65535, 65536, 1<<31 - 1, 1 << 31, 1<<53 - 1, 1 << 62,
		-1, -32, -33, -128, -129, -1 << 31, -1<<31 - 1, -1 << 53}
	strs := []string{"", "a", "0.7", "k1 1 3;- 2 2", strings.Repeat("x", 70000)}
	a := newScriptArgs(0)
	var want []any
	for _, v := range ints {
		a.int(v)
		want = append(want, v)
	}
	a.flag(true)
	a.flag(false)
	want = append(want, int64(1), int64(0))
	for _, s := range strs {
		a.str(s)
		want = append(want, s)
	}
	// Each number goes back as a string of its digits: Redis would
	// truncate a Lua number above 2^63 it replied, and tells none.
	echo := redis.NewScript(`
local out = {}
for i, v in ipairs(cmsgpack.unpack(ARGV[1])) do
	if type(v) == 'number' then out[i] = {'n', string.format('%.0f', v)} else out[i] = {'s', v} end
end
return out`)
	reply, err := echo.Run(context.Background(), cli, []string{"k"}, a.packed()).Slice()
	if err != nil {
		t.Fatal(err)
	}
	var got []any
	for _, r := range reply {
		kv := r.([]any)
		if kv[0] == "n" {
			n, err := strconv.ParseInt(kv[1].(string), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, n)
		} else {
			got = append(got, kv[1])
		}
	}
	if len(got) != len(want) {
		t.Fatalf("Redis decoded %d elements, want %d", len(got), len(want))
	}
	for i := range got {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("element %d: Redis decoded %.40s, want %.40s", i, fmt.Sprint(got[i]), fmt.Sprint(want[i]))
		}
	}
}
