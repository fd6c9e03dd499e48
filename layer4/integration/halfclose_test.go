package integration

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// TestHalfCloseHoldsSlot: a client that sends its request and shuts its
// write side still holds its slot while it reads the answer, so under
// `inflight 1` its second connection is closed and the backend never
// holds two.
func TestHalfCloseHoldsSlot(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	answer := make(chan struct{})
	var requests, active, most atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	release := sync.OnceFunc(func() { close(answer) })
	defer release() // before the wait, should the test end early
	go func() {
		for {
			conn, err := up.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				io.Copy(io.Discard, conn) // the request, to the client's half-close
				requests.Add(1)
				n := active.Add(1)
				defer active.Add(-1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				<-answer
				conn.Write([]byte("answer"))
			})
		}
	}()
	at := addr(t)
	c := startCaddy(t, l4(at, "\t\t\t\tinflight 1\n\t\t\t\tproxy "+up.Addr().String()+"\n"), "", at)

	first := dial(t, at, "127.0.0.1")
	first.Write([]byte("request"))
	first.CloseWrite()
	eventually(t, "the backend has read the first request to its end", func() bool { return requests.Load() == 1 })

	second := dial(t, at, "127.0.0.1")
	second.Write([]byte("request"))
	second.CloseWrite()
	var secondGot atomic.Pointer[[]byte]
	go func() {
		b, _ := io.ReadAll(second)
		secondGot.Store(&b)
	}()
	eventually(t, "the second connection is closed or its request reaches the backend", func() bool {
		return secondGot.Load() != nil || requests.Load() == 2
	})
	release()
	if got, _ := io.ReadAll(first); string(got) != "answer" {
		t.Errorf("the first client read %q, want its answer", got)
	}
	eventually(t, "the second connection ends", func() bool { return secondGot.Load() != nil })
	if m := most.Load(); m != 1 || len(*secondGot.Load()) != 0 {
		t.Fatalf("the backend held %d connections at once under inflight 1 (the second client read %q), want 1 and the second closed", m, *secondGot.Load())
	}
	if z := c.zone(t, zoneOf(at)); z.Refused["full"] != 1 {
		t.Errorf("admin API: refused %v, want full 1", z.Refused)
	}
	first.Close()
	eventually(t, "the slot is given back", func() bool { return c.held(t, zoneOf(at)) == 0 })
	t.Logf("backend held at most %d connection(s); the second client's connection was closed (refused: full)", most.Load())
}
