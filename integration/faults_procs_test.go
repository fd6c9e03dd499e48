package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The processes of the fault suite: Redis, which it freezes and flushes,
// and a fleet of Caddy processes, which it reloads and kills. The real
// topologies (Cluster, Sentinel) are in faults_topology_test.go.

// pause freezes Redis with SIGSTOP: connections stay open, nothing answers.
func (r *redisServer) pause() { r.cmd.Process.Signal(syscall.SIGSTOP) }

// unpause lets a paused Redis run again (SIGCONT).
func (r *redisServer) unpause() { r.cmd.Process.Signal(syscall.SIGCONT) }

// do runs one command on r, as an operator would with redis-cli.
func (r *redisServer) do(t testing.TB, args ...any) *redis.Cmd {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: r.addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Do(ctx, args...)
}

// faultSite is what every instance of the fleet runs; reloads change it.
type faultSite struct {
	address    string // Redis address(es), space separated
	masterName string
	tls        []string // the store's tls options, such as "tls_ca ca.pem"
	lease      time.Duration
	timeout    time.Duration
	onError    string
	tenantMax  int
	total      int
	wait       time.Duration
	cost       bool // requests cost X-Cost units
	fair       bool // the tenants share fairly (fair tenant)
}

// variant names the site's options in a fault run's name.
func (s faultSite) variant() string {
	var v string
	if s.cost {
		v += fmt.Sprintf(", costs 1-%d", maxCost)
	}
	if s.fair {
		v += ", fair"
	}
	return v
}

// fleetMember is one Caddy process of a fleet under test.
type fleetMember struct {
	*caddyProcess
	site        faultSite // what it runs now
	port, admin int
	log         string
	url         string
}

// render is one instance's whole Caddyfile.
func (s faultSite) render(m *fleetMember, backend string) string {
	var total, master string
	if s.total > 0 {
		total = fmt.Sprintf("\n\t\ttotal %d", s.total)
	}
	if s.cost {
		total += "\n\t\tcost {header.X-Cost}"
	}
	if s.fair {
		total += "\n\t\tfair tenant"
	}
	if s.masterName != "" {
		master = "\n\t\t\tmaster_name " + s.masterName
	}
	for _, o := range s.tls {
		master += "\n\t\t\t" + o
	}
	return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	default_bind 127.0.0.1
	auto_https off
	persist_config off
	log {
		output file %s
		format json
	}
}
http://127.0.0.1:%d {
	inflight {
		limit tenant {header.X-Tenant} %d%s
		zone faults
		replicas 3
		wait %s
		store redis {
			address %s%s
			lease %s
			timeout %s
			on_error %s
		}
	}
	reverse_proxy %s
}
`, m.admin, m.log, m.port, s.tenantMax, total, s.wait, s.address, master, s.lease, s.timeout, s.onError, backend)
}

// startFleet runs a Caddy process per site.
func startFleet(t *testing.T, sites []faultSite, backend string) []*fleetMember {
	t.Helper()
	var fleet []*fleetMember
	for _, site := range sites {
		m := &fleetMember{site: site, port: freePort(t), admin: freePort(t), log: filepath.Join(t.TempDir(), "caddy.log")}
		m.url = fmt.Sprintf("http://127.0.0.1:%d", m.port)
		m.caddyProcess = startCaddy(t, site.render(m, backend), m.port)
		fleet = append(fleet, m)
	}
	return fleet
}

// reload loads a new site into the running instance through its admin API,
// as `caddy reload` does.
func (m *fleetMember) reload(site faultSite, backend string) error {
	req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/load", m.admin),
		strings.NewReader(site.render(m, backend)))
	req.Header.Set("Content-Type", "text/caddyfile")
	resp, err := adminClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("reload: %s", resp.Status)
	}
	m.site = site
	return nil
}

// logLines returns the instance's log lines containing text.
func (m *fleetMember) logLines(text string) []string {
	data, _ := os.ReadFile(m.log)
	var lines []string
	for line := range strings.Lines(string(data)) {
		if strings.Contains(line, text) {
			lines = append(lines, strings.TrimSpace(line))
		}
	}
	return lines
}
