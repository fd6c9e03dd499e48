package inflight

import (
	"net"
	"testing"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// FuzzKeys evaluates keys from hostile header values and peer addresses
// (huge, invalid UTF-8, NUL bytes, empty, IPv6 zones, IPv4-mapped IPv6) and
// admits and releases them: nothing may panic, the IPv4-mapped form must be
// the IPv4 key, and the zone must be empty afterwards.
func FuzzKeys(f *testing.F) {
	for _, seed := range [][2]string{
		{"key", "192.0.2.1"}, {"", "::ffff:192.0.2.1"}, {"\x00\xff\xfe", "fe80::1%eth0"},
		{string(make([]byte, 4096)), "2001:db8::1"}, {"a,b", ""}, {"::ffff:1.2.3.4", "::ffff:"},
	} {
		f.Add(seed[0], seed[1])
	}
	ipKey, headerKey := compileKey(DefaultKey), compileKey("{http.request.header.X-Api-Key}")
	zone := limiter.NewZone(2, true, nil)
	lim := &limiter.Limits{Max: []int64{2, 2}, Total: 4}
	f.Fuzz(func(t *testing.T, header, ip string) {
		r, _ := request(net.JoinHostPort(ip, "1234"), "X-Api-Key", header)
		a := struct{ req limiter.Request }{limiter.Request{Keys: make([]string, 2), Max: make([]int64, 2)}}
		a.req.Limits = lim
		a.req.Keys[0], a.req.Keys[1] = ipKey(r), headerKey(r)
		if parsed := net.ParseIP(ip); parsed != nil && parsed.To4() != nil && a.req.Keys[0] != "" && a.req.Keys[0] != parsed.To4().String() {
			t.Fatalf("peer %q keyed as %q, want the IPv4 form %s", ip, a.req.Keys[0], parsed.To4())
		}
		if slot, _ := zone.TryAcquire(&a.req); slot != nil {
			slot.Release()
		}
		st := zone.State(limiter.Look{Dims: true})
		if st.Dims[0].Units+st.Dims[1].Units+st.Total.Units != 0 || st.Dims[0].Keys+st.Dims[1].Keys != 0 {
			t.Fatal("the zone is not empty after release")
		}
	})
}
