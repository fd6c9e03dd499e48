package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// modelBackend holds every request until its gate opens, then answers with
// whether the body it received is the one its client sent (X-Body-Len and
// the model at its end), so that a body read for its model, and ahead while
// it waited, is seen to arrive whole.
type modelBackend struct {
	held atomic.Int64
	gate chan struct{}
	once sync.Once
	mu   sync.Mutex
	seen map[string]int // model -> requests that reached the backend
}

func newModelBackend(t *testing.T) (*modelBackend, string) {
	b := &modelBackend{gate: make(chan struct{}), seen: map[string]int{}}
	addr := serveAt(t, "127.0.0.1:0", b)
	t.Cleanup(b.open)
	return b, addr
}

func (b *modelBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	want := modelBody(r.Header.Get("X-Model"), len(body))
	b.mu.Lock()
	b.seen[r.Header.Get("X-Model")]++
	b.mu.Unlock()
	b.held.Add(1)
	defer b.held.Add(-1)
	<-b.gate
	if err != nil || !bytes.Equal(body, want) || fmt.Sprint(len(body)) != r.Header.Get("X-Body-Len") {
		http.Error(w, fmt.Sprintf("body of %d bytes (%v), not the one sent", len(body), err), http.StatusBadGateway)
		return
	}
	io.WriteString(w, "ok")
}

func (b *modelBackend) open() { b.once.Do(func() { close(b.gate) }) }

func (b *modelBackend) reached(model string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seen[model]
}

// modelBody is an OpenAI chat request of size bytes naming model after its
// messages, as the Python SDK writes it, with a decoy "model" in its text;
// model "" names none but the decoy.
func modelBody(model string, size int) []byte {
	head, tail := `{"messages":[{"role":"user","content":"answer as {\"model\":\"decoy\"} `, `"}]`
	if model != "" {
		tail += `,"model":"` + model + `"`
	}
	tail += "}"
	return []byte(head + strings.Repeat("x", max(size-len(head)-len(tail), 0)) + tail)
}

// TestModelLimit: `limit model {http.inflight.model} 2` caps each model the
// request bodies name: a third request for model-a is refused (or, with
// wait, waits) while two are in flight, and a request for model-b is
// admitted. A request whose model cannot be read counts under _unknown,
// capped like any model, however its text mentions one. Each body reaches
// the backend whole: read for its model, and with wait read ahead too (its
// 100 KB are more than the 64 KiB read ahead). The same with the counts
// in Redis.
func TestModelLimit(t *testing.T) {
	for _, c := range []struct {
		name  string
		wait  bool
		redis bool
	}{{"refused", false, false}, {"wait", true, false}, {"redis refused", false, true}, {"redis wait", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			b, addr := newModelBackend(t)
			options := ""
			if c.wait {
				options += "\n\t\twait 30s"
			}
			if c.redis {
				options += fmt.Sprintf("\n\t\tstore redis {\n\t\t\taddress %s\n\t\t}", startRedis(t).addr)
			}
			zone := "model-" + strings.ReplaceAll(c.name, " ", "-")
			port := freePort(t)
			load(t, fmt.Sprintf(`http://127.0.0.1:%d {
	inflight {
		limit model {http.inflight.model} 2
		zone %s%s
	}
	reverse_proxy %s
}
`, port, zone, options, addr))
			url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
			c1 := client("127.0.0.1")
			send := func(model string) <-chan result {
				done := make(chan result, 1)
				body := modelBody(model, 100_000)
				go func() {
					done <- post(context.Background(), c1, url, string(body), "Content-Type", "application/json", "X-Model", model, "X-Body-Len", fmt.Sprint(len(body)))
				}()
				return done
			}
			held := func(n int64) func() bool { return func() bool { return b.held.Load() == n } }
			a1, a2 := send("model-a"), send("model-a")
			eventually(t, "two model-a requests at the backend", held(2))
			third := send("model-a")
			if c.wait {
				eventually(t, "the third model-a request waits", func() bool { return metric(t, "caddy_inflight_waiting", `zone="`+zone+`"`) == 1 })
			} else if r := <-third; r.status != http.StatusTooManyRequests {
				t.Fatalf("a third model-a request while two are in flight: %d %v, want 429", r.status, r.err)
			}
			other := send("model-b")
			eventually(t, "a model-b request at the backend beside them", held(3))
			var unknown []<-chan result
			if !c.wait {
				unknown = append(unknown, send(""), send(""))
				eventually(t, "two requests of no model at the backend", held(5))
				if r := <-send(""); r.status != http.StatusTooManyRequests {
					t.Fatalf("a third request naming no model: %d %v, want 429: it counts under _unknown", r.status, r.err)
				}
			}
			if b.reached("model-a") != 2 {
				t.Fatalf("%d model-a requests reached the backend, want 2", b.reached("model-a"))
			}
			b.open()
			waits := []<-chan result{a1, a2, other}
			if c.wait {
				waits = append(waits, third)
			}
			for _, done := range append(waits, unknown...) {
				if r := <-done; r.err != nil || r.status != http.StatusOK {
					t.Fatalf("%d %q %v, want 200 and the body received whole", r.status, r.body, r.err)
				}
			}
			eventually(t, "nothing held in the zone", func() bool {
				return metric(t, "caddy_inflight_units", `zone="`+zone+`"`) == 0
			})
		})
	}
}

// TestModelClass: a class from a map of the model. With one slot held, a
// request for model-b (low) then one for model-a (high) wait; the slot
// goes to model-a first, though it came second.
func TestModelClass(t *testing.T) {
	b := newBackend(t)
	port := freePort(t)
	load(t, fmt.Sprintf(`http://127.0.0.1:%d {
	map {http.inflight.model} {model_class} {
		model-a high
		default low
	}
	inflight {
		limit model {http.inflight.model} 10
		total 1
		zone model-class
		wait 30s
		priority {model_class}
	}
	reverse_proxy %s
}
`, port, b.addr))
	url := fmt.Sprintf("http://127.0.0.1:%d/hold", port)
	c := client("127.0.0.1")
	send := func(model string) <-chan result {
		done := make(chan result, 1)
		go func() { done <- post(context.Background(), c, url, string(modelBody(model, 200)), "X-Name", model) }()
		return done
	}
	var all []<-chan result
	all = append(all, send("model-c"))
	eventually(t, "the slot held", func() bool { return b.cur.Load() == 1 })
	for i, model := range []string{"model-b", "model-a"} {
		all = append(all, send(model))
		eventually(t, model+" waits", func() bool { return metric(t, "caddy_inflight_waiting", `zone="model-class"`) == float64(i+1) })
	}
	b.open()
	for _, done := range all {
		if r := <-done; r.err != nil || r.status != http.StatusOK {
			t.Fatalf("%d %v, want 200", r.status, r.err)
		}
	}
	if got := strings.Join(b.order(), " "); got != "model-c model-a model-b" {
		t.Fatalf("the backend saw %s, want model-c model-a model-b: model-a's class is high", got)
	}
}
