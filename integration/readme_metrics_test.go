package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// readmeSection returns the section of a document (README.md or a file of
// docs/) under the given heading, up to the next heading of the same level.
func readmeSection(t *testing.T, doc, heading string) string {
	t.Helper()
	raw, err := os.ReadFile("../" + doc)
	if err != nil {
		t.Fatal(err)
	}
	level := heading[:strings.IndexByte(heading, ' ')+1]
	_, section, ok := strings.Cut(string(raw), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("%s has no %q", doc, heading)
	}
	section, _, _ = strings.Cut(section, "\n"+level)
	return section
}

// TestREADMEMetricsTableIsComplete exports every metric the module has (a
// zone with per-key metrics, a request held and one waiting, a Redis store
// that cannot be reached, an adaptive total) and checks that the README's Metrics section
// names each metric and each value of its reason, outcome and op labels.
func TestREADMEMetricsTableIsComplete(t *testing.T) {
	b := newBackend(t)
	cfg, url := site(t, b, "\tinflight {\n\t\tlimit client {client_ip} 1\n\t\tzone doc\n\t\twait 30s\n\t\tmetrics per_key\n\t}")
	storePort := freePort(t)
	cfg += fmt.Sprintf("http://127.0.0.1:%d {\n\tinflight 5 {\n\t\tzone down\n\t\tstore redis {\n\t\t\taddress 127.0.0.1:%d\n\t\t\ttimeout 100ms\n\t\t}\n\t}\n\trespond ok\n}\n", storePort, freePort(t))
	cfg += fmt.Sprintf("http://127.0.0.1:%d {\n\tinflight {\n\t\tzone adaptive_doc\n\t\ttotal adaptive\n\t}\n\trespond ok\n}\n", freePort(t))
	load(t, cfg)
	c := client("127.0.0.1")
	held := hold(t, b, context.Background(), c, url+"/hold")
	ctx, cancel := context.WithCancel(context.Background())
	waiter := make(chan result, 1)
	go func() { waiter <- get(ctx, c, url+"/") }()
	eventually(t, "a request waits", func() bool { return metric(t, "caddy_inflight_waiting", `zone="doc"`) == 1 })
	if r := get(context.Background(), c, fmt.Sprintf("http://127.0.0.1:%d/", storePort)); r.status != 200 {
		t.Fatalf("Redis unreachable, on_error open: %d, want 200", r.status)
	}
	exported := adminGet(t, "/metrics")
	if want := `caddy_inflight_store_errors_total{op="acquire",store="redis",zone="down"}`; !strings.Contains(exported, want) {
		t.Errorf("no %s: the store's metrics do not name its zone", want)
	}
	cancel()
	<-waiter
	b.open()
	<-held

	doc := readmeSection(t, "docs/observability.md", "## Metrics")
	families := regexp.MustCompile(`(?m)^# TYPE (caddy_inflight_\w+) `).FindAllStringSubmatch(exported, -1)
	if len(families) < 8 {
		t.Fatalf("only %d caddy_inflight metrics exported:\n%s", len(families), exported)
	}
	for _, f := range families {
		if !strings.Contains(doc, "`"+f[1]+"`") {
			t.Errorf("the README's Metrics section does not list %s", f[1])
		}
	}
	values := regexp.MustCompile(`(?m)^caddy_inflight_\w+\{.*\b(reason|outcome|op)="([^"]+)"`).FindAllStringSubmatch(exported, -1)
	seen := map[string]bool{}
	for _, v := range values {
		if seen[v[1]+v[2]] {
			continue
		}
		seen[v[1]+v[2]] = true
		if !strings.Contains(doc, "`"+v[2]+"`") {
			t.Errorf("the README's Metrics section does not name %s %q", v[1], v[2])
		}
	}
}

// hexKey is a key as the admin API shows it without per-key metrics.
var hexKey = regexp.MustCompile(`"#[0-9a-f]{16}"`)

// TestREADMEInflightSample produces the README's `GET /inflight/` sample
// (zone api; limit tenant, max 3; tenant a holding 3 with 7 more waiting,
// tenant b holding 1) and checks it is what the admin API answers, keys
// aside (their hashes are seeded per process).
func TestREADMEInflightSample(t *testing.T) {
	section := readmeSection(t, "docs/observability.md", "### Live state: who is holding my backend?")
	_, sample, ok := strings.Cut(section, "curl -s localhost:2019/inflight/\n")
	if !ok {
		t.Fatal("the README's Live state section has no `curl -s localhost:2019/inflight/` sample")
	}
	sample, _, _ = strings.Cut(sample, "```")

	b := newBackend(t)
	cfg, url := site(t, b, "\tinflight {\n\t\tlimit tenant {header.X-Tenant} 3\n\t\ttotal 100\n\t\tzone api\n\t\twait 30s\n\t}")
	load(t, cfg)
	c := client("127.0.0.1")
	var held []<-chan result
	for range 3 {
		held = append(held, hold(t, b, context.Background(), c, url+"/hold", "X-Tenant", "a"))
	}
	held = append(held, hold(t, b, context.Background(), c, url+"/hold", "X-Tenant", "b"))
	for range 7 {
		ch := make(chan result, 1)
		go func() { ch <- get(context.Background(), c, url+"/hold", "X-Tenant", "a") }()
		held = append(held, ch)
	}
	eventually(t, "7 requests wait", func() bool { return metric(t, "caddy_inflight_waiting", `zone="api"`) == 7 })
	got := adminGet(t, "/inflight/")
	b.open()
	for _, h := range held {
		<-h
	}

	if !hexKey.MatchString(sample) {
		t.Errorf("the README's sample shows no key as the admin API shows them by default (#, 16 hex digits):\n%s", sample)
	}
	var want, have any
	if err := json.Unmarshal([]byte(anonymiseKeys(sample)), &want); err != nil {
		t.Fatalf("the README's sample is not JSON: %v\n%s", err, sample)
	}
	if err := json.Unmarshal([]byte(anonymiseKeys(got)), &have); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(want, have) {
		t.Fatalf("GET /inflight/ answers\n%s\nbut the README's sample says\n%s", got, sample)
	}
}

// anonymiseKeys names hashed keys by order of first appearance.
func anonymiseKeys(s string) string {
	names := map[string]string{}
	return hexKey.ReplaceAllStringFunc(s, func(k string) string {
		if names[k] == "" {
			names[k] = fmt.Sprintf(`"key%d"`, len(names)+1)
		}
		return names[k]
	})
}
