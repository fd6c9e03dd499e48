package integration

import (
	"io"
	"net"
	"testing"
	"time"
)

// BenchmarkConnection measures what a connection costs, opened, echoed
// once and closed through a caddy-l4 echo route, without and with
// `inflight` (one client address, under its cap), in one Caddy. The two
// alternate, so a busy machine slows both alike; it reports each one's
// time and their ratio:
//
//	unshare -n sh -c 'ip link set lo up && go test -run "^$" -bench Connection -benchtime 20000x ./integration'
func BenchmarkConnection(b *testing.B) {
	plain, limited := addr(b), addr(b)
	startCaddy(b, l4(plain, "\t\t\t\techo\n")+l4(limited, "\t\t\t\tinflight 10000\n\t\t\t\techo\n"), "", plain, limited)
	buf := make([]byte, 4)
	roundTrip := func(at string) time.Duration {
		started := time.Now()
		conn, err := net.Dial("tcp", at)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.Write([]byte("ping")); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(conn, buf); err != nil {
			b.Fatalf("not echoed: %v", err)
		}
		return time.Since(started)
	}
	var without, with time.Duration
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 { // alternate which goes first
			without += roundTrip(plain)
			with += roundTrip(limited)
		} else {
			with += roundTrip(limited)
			without += roundTrip(plain)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(without.Nanoseconds())/n, "ns/conn-echo")
	b.ReportMetric(float64(with.Nanoseconds())/n, "ns/conn-inflight")
	b.ReportMetric(float64(with)/float64(without), "ratio")
}
