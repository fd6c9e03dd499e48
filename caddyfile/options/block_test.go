package options

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
)

// TestSharedNamesTheOptionsItReads: every option Shared names is one
// ParseBlock reads, and one it does not read is refused with the list, so
// the lists in messages name what a block may hold.
func TestSharedNamesTheOptionsItReads(t *testing.T) {
	b := Block{Subdirectives: List("own")}
	for _, opt := range Shared {
		err := ParseBlock(caddyfile.NewTestDispenser("inflight 1 {\n\t"+opt+"\n}"), new(core.Config), b)
		if err != nil && strings.Contains(err.Error(), "unknown subdirective") {
			t.Errorf("%s: %v", opt, err)
		}
	}
	err := ParseBlock(caddyfile.NewTestDispenser("inflight 1 {\n\tburst 5\n}"), new(core.Config), b)
	want := `inflight: unknown subdirective "burst": want one of limit, total, zone, dry_run, replicas, wait, max_waiting, max_waiting_per_key, priority, fair, weight, max_keys, metrics, store, own, at Testfile:2`
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
}
