// Command slow-backend is the backend of examples/config.json: it answers
// every request on 127.0.0.1:8081 after two seconds. It runs as a process
// of its own, so that a live change to Caddy's config (which restarts every
// server in that config) does not cut its responses short:
//
//	go run ./examples/slow-backend &
//	go run ./examples/caddy run --config examples/config.json
package main

import (
	"io"
	"log"
	"net/http"
	"time"
)

func main() {
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(2 * time.Second):
			io.WriteString(w, "slow response from the backend\n")
		case <-r.Context().Done():
		}
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:8081", slow))
}
