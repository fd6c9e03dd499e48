package redisstore

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
)

// After more failed dials than go-redis's pool holds connections (a few
// outages' worth), Redis answers the first call sent once it is back.
// go-redis failed every dial at once with the last dial's error until its
// probe dial, once a second, succeeded: after a Sentinel failover, calls
// kept failing with the dead master's address, each a new outage.
func TestFirstCallAfterManyFailedDials(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := newStore(t, store(addr, nil))
	ctx := context.Background()
	for i := range 3 * 10 * 2 { // go-redis's pool size: 10 per CPU
		if err := s.book.client.Ping(ctx).Err(); err == nil {
			t.Fatalf("ping %d answered with nothing listening", i)
		}
	}
	redisAddr, _ := startRedis(t)
	forward(t, addr, redisAddr)
	if err := s.book.client.Ping(ctx).Err(); err != nil {
		t.Errorf("the first call after Redis is back: %v, want an answer", err)
	}
}

// forward listens on addr and relays each connection to target.
func forward(t *testing.T, addr, target string) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			t.Cleanup(func() { c.Close(); up.Close() })
			go io.Copy(up, c)
			go io.Copy(c, up)
		}
	}()
}
