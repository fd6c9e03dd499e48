package integration

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// rawGet sends a GET with header lines written byte for byte (Go's client
// refuses some of them) and returns the response status.
func rawGet(t *testing.T, addr, path string, headerLines ...string) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n%s\r\n", path, addr, strings.Join(headerLines, ""))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no response: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A key that is not valid UTF-8, shown raw in per-key metrics, is served
// like any other and leaves nothing held.
func TestKeyThatIsNotUTF8WithPlainKeyMetrics(t *testing.T) {
	b := newBackend(t)
	cfg, url := site(t, b, "\tinflight {\n\t\tlimit key {header.X-Key} 5\n\t\tmetrics per_key plain\n\t}")
	load(t, cfg)
	addr := strings.TrimPrefix(url, "http://")
	for _, key := range []string{"bad\xff\xfekey", "\xc3", "ok"} {
		if status := rawGet(t, addr, "/", "X-Key: "+key+"\r\n"); status != 200 {
			t.Fatalf("key %q: status %d, want 200", key, status)
		}
	}
	// A client reads its answer before the handler returns its slot.
	eventually(t, "every zone is empty after the requests ended", func() bool { return zonesEmpty(t) })
	eventually(t, "the per-key series sum to 0 after the requests ended", func() bool {
		return metric(t, "caddy_inflight_key_requests") == 0
	})
	// A held request with such a key shows it escaped, as valid UTF-8.
	done := hold(t, b, t.Context(), client("127.0.0.1"), url+"/hold", "X-Key", "v\xffw")
	if got := metric(t, "caddy_inflight_key_requests", `key="v\\xffw"`); got != 1 {
		t.Fatalf(`caddy_inflight_key_requests{key="v\xffw"} = %v, want 1`, got)
	}
	b.open()
	<-done
}
