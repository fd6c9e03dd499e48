package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// bodyBackend answers with the SHA-256 of the body it read, after holding
// /hold requests until the test opens its gate.
type bodyBackend struct {
	*backend
}

func newBodyBackend(t *testing.T) *bodyBackend {
	b := &bodyBackend{backend: &backend{gate: make(chan struct{})}}
	b.addr = serveAt(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		if r.URL.Path == "/hold" {
			b.cur.Add(1)
			b.mu.Lock()
			gate := b.gate
			b.mu.Unlock()
			<-gate
			b.cur.Add(-1)
		}
		fmt.Fprintf(w, "%x", sha256.Sum256(body))
	}))
	return b
}

// TestCostTokensHostileBodies: what a client writes in its body decides
// its estimate, so the bodies are attacked: a huge max_tokens counts as
// the whole budget (admitted alone, never refused for its size), a body
// that is not JSON passes whole, a chunked body beyond max_body is
// admitted alone, a body cut short takes nothing, and every admitted body
// reaches the backend byte for byte, a waiting one and one sent after
// Expect: 100-continue included.
func TestCostTokensHostileBodies(t *testing.T) {
	b := newBodyBackend(t)
	port := freePort(t)
	load(t, fmt.Sprintf(`http://127.0.0.1:%d {
	inflight {
		limit tenant {header.X-Tenant} 4000
		cost tokens {
			max_body 64KiB
		}
		zone tokens
		wait 30s
	}
	reverse_proxy %s
}
`, port, b.addr))
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := client("127.0.0.1")
	units := func() float64 { return metric(t, "caddy_inflight_units", `zone="tokens"`, `limit="tenant"`) }
	post := func(ctx context.Context, path, tenant string, body io.Reader, header ...string) result {
		req, _ := http.NewRequestWithContext(ctx, "POST", url+path, body)
		req.Header.Set("X-Tenant", tenant)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := c.Do(req)
		if err != nil {
			return result{err: err}
		}
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		return result{status: resp.StatusCode, body: string(got), err: err}
	}
	sum := func(s string) string { return fmt.Sprintf("%x", sha256.Sum256([]byte(s))) }

	// A huge max_tokens: the whole budget, admitted alone, then a small one
	// of the tenant waits for it, and gets its body through intact.
	huge := `{"max_tokens":99999999999999999999999,"messages":[]}`
	done := make(chan result, 1)
	go func() { done <- post(context.Background(), "/hold", "t", strings.NewReader(huge)) }()
	eventually(t, "the huge request holds the whole budget", func() bool { return units() == 4000 })
	small := `{"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
	waiting := make(chan result, 1)
	go func() { waiting <- post(context.Background(), "/", "t", strings.NewReader(small)) }()
	eventually(t, "the small one waits", func() bool { return metric(t, "caddy_inflight_waiting", `zone="tokens"`) == 1 })
	b.open()
	if r := <-done; r.status != 200 || r.body != sum(huge) {
		t.Fatalf("huge max_tokens: %d %q %v", r.status, r.body, r.err)
	}
	if r := <-waiting; r.status != 200 || r.body != sum(small) {
		t.Fatalf("the waiter's body: %d %q %v, want 200 and its hash", r.status, r.body, r.err)
	}

	// Not JSON, chunked beyond max_body, and Expect: 100-continue.
	junk := strings.Repeat("\xff{[\"", 3000)
	if r := post(context.Background(), "/", "t", strings.NewReader(junk)); r.status != 200 || r.body != sum(junk) {
		t.Fatalf("a body that is not JSON: %d %v", r.status, r.err)
	}
	big := strings.Repeat("x", 200<<10)
	if r := post(context.Background(), "/", "t", io.MultiReader(strings.NewReader(big))); r.status != 200 || r.body != sum(big) {
		t.Fatalf("a chunked body beyond max_body: %d %v", r.status, r.err)
	}
	ec := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: 5 * time.Second}}
	req, _ := http.NewRequest("POST", url+"/", bytes.NewReader([]byte(small)))
	req.Header.Set("X-Tenant", "t")
	req.Header.Set("Expect", "100-continue")
	resp, err := ec.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(got) != sum(small) {
		t.Fatalf("Expect: 100-continue: %d %q", resp.StatusCode, got)
	}

	// A body cut short: the client goes mid-body; nothing is held after.
	conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Tenant: t\r\nContent-Length: 10000\r\n\r\n{\"max_tokens\": 3")
	time.Sleep(50 * time.Millisecond)
	conn.Close()
	eventually(t, "no unit held after every request ended", func() bool { return units() == 0 })
}
