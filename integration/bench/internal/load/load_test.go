package load

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestCheckLoopback(t *testing.T) {
	for url, ok := range map[string]bool{
		"http://127.0.0.1:8080/":    true,
		"http://127.1.2.3/x":        true,
		"http://[::1]:8080/":        true,
		"http://localhost:8080/":    false, // a name could resolve anywhere
		"http://10.0.0.1/":          false,
		"http://example.com/":       false,
		"http://[2001:db8::1]:80/":  false,
		"https://127.0.0.1:8443/":   false,
		"http://0.0.0.0:8080/":      false,
		"http://127.0.0.1.nip.io/":  false,
		"http://user@10.0.0.1:80/x": false,
	} {
		if err := CheckLoopback(url); (err == nil) != ok {
			t.Errorf("CheckLoopback(%q) = %v, want ok %v", url, err, ok)
		}
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	for ms := 1; ms <= 100; ms++ {
		h.record(time.Duration(ms) * time.Millisecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}} {
		got := h.quantile(c.q)
		if d := got - c.want; d < -c.want/100 || d > c.want/100 {
			t.Errorf("quantile(%v) = %v, want %v within 1%%", c.q, got, c.want)
		}
	}
}

func TestRunIsBoundedInCount(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/busy" {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer srv.Close()
	for path, status := range map[string]string{"/": "200", "/busy": "429"} {
		res, err := Run(context.Background(), Options{URL: srv.URL + path, Workers: 4, Duration: time.Minute, MaxRequests: 100, Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests != 100 || res.Errors != 0 || res.Status[status] != 100 {
			t.Errorf("%s: %+v, want 100 requests, all %s", path, res, status)
		}
	}
}
