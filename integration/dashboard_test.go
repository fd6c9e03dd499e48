package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

// dashboard is what the test reads of examples/grafana-dashboard.json.
type dashboard struct {
	Templating struct {
		List []struct{ Name, Query string }
	}
	Panels []struct {
		Title   string
		Targets []struct{ Expr string }
	}
}

// TestExampleDashboardPanelsHaveData runs a real Caddy under traffic that
// gives every panel of the Grafana dashboard something to show (a zone on
// Redis with per-key metrics, a request held, one that waited and one
// waiting; a zone whose Redis is unreachable, which refuses; an adaptive
// total, whose requests cost 2), scrapes /metrics and checks every query against the scrape:
// each metric it selects has a sample matching its selector's matchers
// (with the dashboard's "All" zone) and carrying every label the query
// aggregates by.
func TestExampleDashboardPanelsHaveData(t *testing.T) {
	raw, err := os.ReadFile("../examples/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash dashboard
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	redis := startRedis(t)
	b := newBackend(t)
	cfg, url := site(t, b, "\tinflight 1 {\n\t\tzone dash\n\t\twait 30s\n\t\tmetrics per_key\n\t\tstore redis {\n\t\t\taddress "+redis.addr+"\n\t\t}\n\t}")
	down := freePort(t)
	cfg += fmt.Sprintf("http://127.0.0.1:%d {\n\tinflight 5 {\n\t\tzone down\n\t\tstore redis {\n\t\t\taddress 127.0.0.1:%d\n\t\t\ttimeout 100ms\n\t\t\ton_error closed\n\t\t}\n\t}\n\trespond ok\n}\n", down, freePort(t))
	adaptive := freePort(t)
	cfg += fmt.Sprintf("http://127.0.0.1:%d {\n\tinflight {\n\t\tzone adaptive\n\t\ttotal adaptive\n\t\tcost 2\n\t}\n\trespond ok\n}\n", adaptive)
	load(t, cfg)

	c := client("127.0.0.1")
	waiting := func() float64 { return metric(t, "caddy_inflight_waiting", `zone="dash"`) }
	ctx, leave := context.WithCancel(context.Background())
	first := hold(t, b, ctx, c, url+"/hold")
	second, third := make(chan result, 1), make(chan result, 1)
	go func() { second <- get(context.Background(), c, url+"/hold") }()
	eventually(t, "a request waits", func() bool { return waiting() == 1 })
	go func() { third <- get(context.Background(), c, url+"/") }()
	eventually(t, "two requests wait", func() bool { return waiting() == 2 })
	leave() // the first client leaves: its slot goes to a waiter
	<-first
	eventually(t, "a waiter is admitted and held", func() bool { return waiting() == 1 && b.cur.Load() == 1 })
	if r := get(context.Background(), c, fmt.Sprintf("http://127.0.0.1:%d/", down)); r.status != 429 {
		t.Fatalf("Redis unreachable, on_error closed: %d, want 429", r.status)
	}
	for range 5 {
		get(context.Background(), c, fmt.Sprintf("http://127.0.0.1:%d/", adaptive))
	}
	exported := scrape(adminGet(t, "/metrics"))
	// The live page's numbers: the key still waiting shows its wait that
	// ended.
	var state struct {
		Zones []struct {
			Zone       string
			TopWaiting []struct{ Wait *struct{ Count int } } `json:"top_waiting"`
		}
	}
	if err := json.Unmarshal([]byte(adminGet(t, "/inflight/")), &state); err != nil {
		t.Fatal(err)
	}
	shown := false
	for _, z := range state.Zones {
		shown = shown || (z.Zone == "dash" && len(z.TopWaiting) == 1 && z.TopWaiting[0].Wait != nil && z.TopWaiting[0].Wait.Count == 1)
	}
	if !shown {
		t.Errorf("GET /inflight/: %+v; want zone dash's one waiting key with one recent wait", state.Zones)
	}
	b.open()
	<-second
	<-third

	// The docs' figure: 10 series per key and outcome (one key, whose one
	// wait that ended was admitted).
	keyWait := 0
	for _, part := range []string{"_bucket", "_sum", "_count"} {
		keyWait += len(exported["caddy_inflight_key_wait_seconds"+part])
	}
	if keyWait != 10 {
		t.Errorf("%d series of caddy_inflight_key_wait_seconds for one key and outcome, want the 10 docs/observability.md states", keyWait)
	}

	queried := 0
	for _, v := range dash.Templating.List {
		if m := labelValues.FindStringSubmatch(v.Query); m != nil {
			queried++
			for _, p := range checkQuery(exported, fmt.Sprintf("group by (%s) (%s)", m[2], m[1])) {
				t.Errorf("variable %q: %s", v.Name, p)
			}
		}
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, target := range p.Targets {
			queried++
			for _, problem := range checkQuery(exported, target.Expr) {
				t.Errorf("panel %q: %s", p.Title, problem)
			}
		}
	}
	if queried < 15 {
		t.Fatalf("only %d queries found in the dashboard", queried)
	}
	// The check itself: a metric or a label the module does not export.
	for _, bad := range []string{`sum by (tenant) (caddy_inflight_requests)`, `rate(caddy_inflight_queue_wait_seconds_count[5m])`, `caddy_inflight_waiting{zone="nowhere"}`} {
		if len(checkQuery(exported, bad)) == 0 {
			t.Errorf("the check finds nothing wrong with %s", bad)
		}
	}
}

var labelValues = regexp.MustCompile(`^label_values\((\w+), *(\w+)\)$`)

// sample is one line of a Prometheus text scrape: its labels.
type sample map[string]string

// scrape parses Prometheus text exposition into each metric's samples.
func scrape(text string) map[string][]sample {
	out := map[string][]sample{}
	line := regexp.MustCompile(`^(\w+)(?:\{(.*)\})? \S+$`)
	label := regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)
	for _, l := range strings.Split(text, "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		s := sample{}
		for _, kv := range label.FindAllStringSubmatch(m[2], -1) {
			s[kv[1]] = kv[2]
		}
		out[m[1]] = append(out[m[1]], s)
	}
	return out
}

var (
	// selector is a metric of the module and its matchers, if any.
	selector = regexp.MustCompile(`(caddy_inflight_\w+)(?:\{([^}]*)\})?`)
	matcher  = regexp.MustCompile(`(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	// grouping is an aggregation's `by (…)`, which applies to the
	// selectors of the parenthesised argument after it.
	grouping = regexp.MustCompile(`\bby\s*\(([^)]*)\)\s*\(`)
)

// checkQuery evaluates a panel's PromQL as far as a scrape can: with the
// dashboard's variables at their "All" values, every metric it selects
// must have a sample that its matchers match and that carries every label
// an enclosing `by (…)` groups by. It returns what is wrong.
func checkQuery(exported map[string][]sample, expr string) []string {
	expr = strings.NewReplacer(`$zone`, `.*`, `$__rate_interval`, `1m`).Replace(expr)
	// by[i] are the labels grouped by at byte i of expr.
	by := make([][]string, len(expr)+1)
	for _, g := range grouping.FindAllStringSubmatchIndex(expr, -1) {
		labels := strings.Fields(strings.ReplaceAll(expr[g[2]:g[3]], ",", " "))
		depth := 0
		for i := g[1] - 1; i < len(expr); i++ {
			switch expr[i] {
			case '(':
				depth++
			case ')':
				depth--
			}
			by[i] = append(by[i], labels...)
			if depth == 0 {
				break
			}
		}
	}
	var problems []string
	selectors := selector.FindAllStringSubmatchIndex(expr, -1)
	if len(selectors) == 0 {
		problems = append(problems, fmt.Sprintf("%s selects no caddy_inflight metric", expr))
	}
	for _, s := range selectors {
		name := expr[s[2]:s[3]]
		var matchers [][]string
		if s[4] >= 0 {
			matchers = matcher.FindAllStringSubmatch(expr[s[4]:s[5]], -1)
		}
		samples := exported[name]
		if len(samples) == 0 {
			problems = append(problems, fmt.Sprintf("%s: no sample of %s in the scrape", expr, name))
			continue
		}
		if !anyMatches(samples, matchers, by[s[0]]) {
			problems = append(problems, fmt.Sprintf("%s: no sample of %s matches {%s} with labels %v", expr, name, expr[max(s[4], s[3]):max(s[5], s[3])], by[s[0]]))
		}
	}
	return problems
}

// anyMatches reports whether a sample matches every matcher (label,
// operator, value) and has every label.
func anyMatches(samples []sample, matchers [][]string, labels []string) bool {
	res := make([]*regexp.Regexp, len(matchers))
	for i, m := range matchers {
		res[i] = regexp.MustCompile("^(?:" + m[3] + ")$")
	}
	for _, s := range samples {
		ok := true
		for i, m := range matchers {
			re := res[i]
			switch m[2] {
			case "=":
				ok = ok && s[m[1]] == m[3]
			case "!=":
				ok = ok && s[m[1]] != m[3]
			case "=~":
				ok = ok && re.MatchString(s[m[1]])
			case "!~":
				ok = ok && !re.MatchString(s[m[1]])
			}
		}
		for _, l := range labels {
			_, has := s[l]
			ok = ok && has
		}
		if ok {
			return true
		}
	}
	return false
}
