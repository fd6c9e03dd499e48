package integration

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// faultProxy is a TCP proxy between the Caddy instances and Redis that
// misbehaves on command: it delays every chunk of bytes, stalls them (held,
// delivered on resume), drops them (a black hole), or resets every
// connection.
type faultProxy struct {
	addr   string
	target string
	ln     net.Listener

	mu      sync.Mutex
	latency time.Duration
	stalled chan struct{} // closed when not stalled
	drop    bool
	conns   map[*net.TCPConn]bool
}

func newFaultProxy(t testing.TB, target string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	running := make(chan struct{})
	close(running)
	p := &faultProxy{addr: ln.Addr().String(), target: target, ln: ln, stalled: running, conns: map[*net.TCPConn]bool{}}
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.Resume()
		p.Reset()
	})
	return p
}

// SetLatency delays every chunk, in both directions, by d.
func (p *faultProxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// Stall holds every byte until Resume: the connections stay open and
// Redis's replies arrive late.
func (p *faultProxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.stalled:
		p.stalled = make(chan struct{})
	default:
	}
}

// Resume delivers what a stall held, and lets bytes through again.
func (p *faultProxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.stalled:
	default:
		close(p.stalled)
	}
}

// Drop discards every byte while on: a partition that TCP does not notice.
func (p *faultProxy) Drop(on bool) {
	p.mu.Lock()
	p.drop = on
	p.mu.Unlock()
}

// Reset closes every connection with a TCP reset.
func (p *faultProxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.SetLinger(0)
		c.Close()
	}
	clear(p.conns)
}

func (p *faultProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c.(*net.TCPConn))
	}
}

func (p *faultProxy) serve(client *net.TCPConn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		client.SetLinger(0)
		client.Close()
		return
	}
	server := s.(*net.TCPConn)
	p.mu.Lock()
	p.conns[client], p.conns[server] = true, true
	p.mu.Unlock()
	go p.pipe(client, server)
	p.pipe(server, client)
}

// chunk is bytes read at a time, delivered no earlier than at+latency.
type chunk struct {
	data []byte
	at   time.Time
}

// pipe copies src to dst through the faults; a reader and a writer, so
// that latency delays bytes without limiting throughput.
func (p *faultProxy) pipe(src, dst *net.TCPConn) {
	chunks := make(chan chunk, 1024)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				chunks <- chunk{buf[:n], time.Now()}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range chunks {
		p.mu.Lock()
		latency, stalled, drop := p.latency, p.stalled, p.drop
		p.mu.Unlock()
		<-stalled
		if drop {
			continue
		}
		time.Sleep(time.Until(c.at.Add(latency)))
		if _, err := dst.Write(c.data); err != nil {
			break
		}
	}
	// One side ended: end both, so the other direction stops too.
	src.Close()
	dst.Close()
	p.mu.Lock()
	delete(p.conns, src)
	delete(p.conns, dst)
	p.mu.Unlock()
}

// pong returns when Redis first answers a PING through p, trying again
// every 50 ms on a new connection (bytes sent into a drop are lost), for
// up to wait.
func (p *faultProxy) pong(t testing.TB, wait time.Duration) time.Time {
	t.Helper()
	buf := make([]byte, len("+PONG\r\n"))
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); {
		c, err := net.DialTimeout("tcp", p.addr, 50*time.Millisecond)
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		c.SetDeadline(time.Now().Add(50 * time.Millisecond))
		_, err = c.Write([]byte("PING\r\n"))
		if err == nil {
			_, err = io.ReadFull(c, buf)
		}
		answered := time.Now()
		c.Close()
		if err == nil && string(buf) == "+PONG\r\n" {
			return answered
		}
	}
	t.Fatalf("Redis did not answer a PING through the proxy to %s within %v", p.target, wait)
	return time.Time{}
}
