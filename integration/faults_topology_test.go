package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The topologies the README names, run locally: the fleet on a Redis
// Cluster, and on Sentinel through a failover.

// TestFaultsCluster: on a cluster of three masters the fleet is exact, and
// FLUSHALL on every master heals like on one server.
func TestFaultsCluster(t *testing.T) {
	t.Parallel() // see TestFaults
	nodes := startRedisCluster(t)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.addr)
	}
	cluster := strings.Join(addrs, " ")
	e := startFaultFleet(t, faultSite{onError: "closed"}, tenantCaps, cluster, cluster, cluster)
	began, healed := e.run(e.renewalBound(), func(e *faultEnv) time.Time {
		for _, n := range nodes {
			if err := n.do(t, "flushall").Err(); err != nil {
				t.Fatal(err)
			}
		}
		return time.Now()
	})
	printTable(t, []windows{e.check("Redis Cluster (3 masters), FLUSHALL on each", began, healed, e.renewalBound(), false)})
}

// TestFaultsSentinel kills the master under Sentinel three times, each
// time the one the sentinels promoted last: the fleet keeps working through
// each failover, logs it as one outage each way, and is exact again within
// a renewal interval of the new master's promotion. Three, not one: the
// second and third failovers run on sentinels that have switched before,
// where go-redis's dial breaker once turned each failover into several
// outages (TestFirstCallAfterManyFailedDials catches that deterministically).
func TestFaultsSentinel(t *testing.T) {
	t.Parallel() // see TestFaults
	const failovers = 3
	s := startSentinels(t)
	sentinels := strings.Join(s.sentinels, " ")
	e := startFaultFleet(t, faultSite{masterName: "faults", onError: "open"}, tenantCaps, sentinels, sentinels, sentinels)
	// An instance learns of the promotion from the sentinels a moment
	// after it, and its last call to the dead master leaves Redis alone for
	// the store's back-off (a second, see book.available), admitting
	// locally meanwhile (on_error open): the bound adds that back-off to
	// the renewal interval.
	bound := e.renewalBound() + storeBackOff
	cycles := e.repeat(failovers, bound, func(e *faultEnv) time.Time {
		return s.failover(t)
	})
	printTable(t, []windows{e.checkCycles(fmt.Sprintf("Sentinel: master SIGKILLed, replica promoted, %d times", failovers), cycles, bound, true)})
	e.wantOutages(failovers)
	s.wantSwitches(t, failovers)
	e.logStoreIfFailed(cycles)
}

// failover kills the master once a kill is one failover and only one
// (ready), and returns the moment a sentinel first names the replica
// master: from then on the fleet can find it. The old master comes back
// as the new one's replica once every sentinel follows the new master.
func (s *sentinelSetup) failover(t *testing.T) (promoted time.Time) {
	t.Helper()
	waitLong(t, "the sentinels agree on the master and see its replica in sync", func() bool { return s.ready(t) })
	killed := time.Now()
	s.master.stop() // SIGKILL
	waitLong(t, "a sentinel names the replica master", func() bool {
		return slices.ContainsFunc(s.clients, func(c *redis.SentinelClient) bool { return namesMaster(c, s.replica) })
	})
	promoted = time.Now()
	t.Logf("the replica was promoted %v after the master was killed", promoted.Sub(killed).Round(10*time.Millisecond))
	// A sentinel that switched reconnects to the new master at most once
	// a second (Sentinel's ping period); until it has, the old master must
	// not be a replica it could promote back.
	waitLong(t, "every sentinel names the new master and has its answer", func() bool {
		return !slices.ContainsFunc(s.clients, func(c *redis.SentinelClient) bool {
			m, err := c.Master(context.Background(), "faults").Result()
			return err != nil || m["ip"]+":"+m["port"] != s.replica.addr || m["flags"] != "master" || m["last-ping-sent"] != "0"
		})
	})
	s.master.args = replicaOf(s.replica)
	s.master.start(t)
	s.master, s.replica = s.replica, s.master
	return promoted
}

// ready reports whether killing the master now makes one failover: every
// sentinel names it, at the same config epoch, with its link up and no
// failover under way, and sees the replica connected to it; and the
// replica is in sync, so the sentinels' leader can promote it.
func (s *sentinelSetup) ready(t *testing.T) bool {
	if s.replica.field(t, "info replication", "master_link_status") != "up" ||
		s.replica.field(t, "info replication", "master_sync_in_progress") != "0" {
		return false
	}
	epochs := map[string]bool{}
	for _, c := range s.clients {
		m, err := c.Master(context.Background(), "faults").Result()
		if err != nil || m["ip"]+":"+m["port"] != s.master.addr || m["flags"] != "master" || m["num-other-sentinels"] != "2" {
			return false
		}
		epochs[m["config-epoch"]] = true
		replicas, err := c.Replicas(context.Background(), "faults").Result()
		if err != nil || !slices.ContainsFunc(replicas, func(r map[string]string) bool {
			return r["name"] == s.replica.addr && r["flags"] == "slave" && r["master-link-status"] == "ok" &&
				r["master-port"] == strconv.Itoa(s.master.port)
		}) {
			return false
		}
	}
	return len(epochs) == 1
}

// namesMaster reports whether the sentinel names r master.
func namesMaster(c *redis.SentinelClient, r *redisServer) bool {
	addr, err := c.GetMasterAddrByName(context.Background(), "faults").Result()
	return err == nil && addr[0]+":"+addr[1] == r.addr
}

// wantSwitches asserts that every sentinel announced n switches of the
// master: a failover the test did not cause (the sentinels taking the new
// master for down) shows here as well as in outages the test did not count.
func (s *sentinelSetup) wantSwitches(t *testing.T, n int) {
	t.Helper()
	for i := range s.switches {
		if got := s.switches[i].Load(); got != int64(n) {
			t.Errorf("sentinel %s announced %d switches of the master (+switch-master), want %d: one per kill", s.sentinels[i], got, n)
		}
	}
}

// TestFaultsTLSRestart restarts a Redis that speaks only TLS, with
// requests waiting: each restart is one outage, logged once each way, and
// costs what a plain restart does. go-redis does not check pooled TLS
// connections before reuse as it checks plain TCP ones: each connection
// pooled before a restart failed its next call with EOF, which was logged
// as a new outage, cut the back-off short, refused (on_error closed) or
// admitted locally (open) after Redis answered again. Three restarts in a
// row with on_error closed, one with open.
func TestFaultsTLSRestart(t *testing.T) {
	t.Parallel() // see TestFaults
	pki := newTestPKI(t)
	for _, c := range []struct {
		onError  string
		restarts int
	}{{"closed", 3}, {"open", 1}} {
		t.Run(c.onError, func(t *testing.T) {
			port := freePort(t)
			r := startRedisWith(t, port, tlsOnly(port, pki, "no")...)
			site := faultSite{onError: c.onError, tls: []string{"tls_ca " + pki.ca, "tls_server_name redis.test"}}
			e := startFaultFleet(t, site, tenantCaps, r.addr, r.addr, r.addr)
			restarts := 0
			cycles := e.repeat(c.restarts, e.renewalBound(), func(e *faultEnv) time.Time {
				restarts++
				r.stop()
				time.Sleep(e.timing.fault)
				e.waitEveryInstanceDown(restarts)
				r.start(t)
				return time.Now()
			})
			printTable(t, []windows{e.checkCycles(fmt.Sprintf("TLS: restart with empty data (down 1 s), %d times, on_error %s", c.restarts, c.onError), cycles, e.renewalBound(), true)})
			e.wantOutages(c.restarts)
			e.logStoreIfFailed(cycles)
		})
	}
}

// logStoreIfFailed logs, if the test failed, when each fault began and
// healed, and what each instance's store and go-redis logged.
func (e *faultEnv) logStoreIfFailed(cycles []cycle) {
	if !e.t.Failed() {
		return
	}
	for i, c := range cycles {
		e.t.Logf("fault %d began at %s (%.3f), healed at %s (%.3f)", i+1, c.began.Format("15:04:05.000"), float64(c.began.UnixMilli())/1000,
			c.healed.Format("15:04:05.000"), float64(c.healed.UnixMilli())/1000)
	}
	for i, m := range e.fleet {
		e.t.Logf("instance %d's store and go-redis lines:\n%s", i, strings.Join(m.logLines(`redis`), "\n"))
	}
}

// waitEveryInstanceDown waits until every instance has logged its nth
// outage as begun: a fault that ends before an instance saw it would be
// logged as fewer outages than faults.
func (e *faultEnv) waitEveryInstanceDown(n int) {
	eventually(e.t, fmt.Sprintf("every instance logged outage %d as begun", n), func() bool {
		return !slices.ContainsFunc(e.fleet, func(m *fleetMember) bool { return len(m.logLines("redis store unreachable")) < n })
	})
}

// field returns one field of a report such as INFO or CLUSTER INFO.
func (r *redisServer) field(t testing.TB, report, name string) string {
	t.Helper()
	var args []any
	for _, w := range strings.Fields(report) {
		args = append(args, w)
	}
	text, _ := r.do(t, args...).Text()
	for line := range strings.Lines(text) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// startRedisCluster runs a Redis Cluster of three masters (no replicas),
// created by redis-cli as an operator would.
func startRedisCluster(t *testing.T) []*redisServer {
	t.Helper()
	var nodes []*redisServer
	var addrs []string
	for range 3 {
		port := clusterPort(t)
		nodes = append(nodes, startRedisWith(t, port, "--cluster-enabled", "yes", "--cluster-node-timeout", "1000"))
		addrs = append(addrs, nodes[len(nodes)-1].addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	out, err := exec.Command("redis-cli", append(args, "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, n := range nodes {
		eventually(t, n.addr+" sees the cluster ok", func() bool { return n.field(t, "cluster info", "cluster_state") == "ok" })
	}
	return nodes
}

// clusterPort returns a free port whose cluster bus port (+10000) is free
// too.
func clusterPort(t *testing.T) int {
	t.Helper()
	for {
		p := freePort(t)
		if p+10000 > 65535 {
			continue
		}
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+10000)); err == nil {
			l.Close()
			return p
		}
	}
}

// sentinelSetup is a master, its replica and three sentinels watching
// them, as master name "faults".
type sentinelSetup struct {
	master, replica *redisServer
	sentinels       []string
	clients         []*redis.SentinelClient // one per sentinel
	switches        []atomic.Int64          // each sentinel's +switch-master announcements
}

// Sentinel's own timing, tuned to fail over fast and only when the test
// kills the master. A sentinel that switches to a new master counts its
// first ping as sent at once but reconnects at most once a second (its
// ping period, SENTINEL_PING_PERIOD), so with down-after-milliseconds
// under a second it sometimes took the new master for down; two such
// sentinels failed it over, back to the old master if that was in sync
// again. Above a second and the reconnection's round trip, a new master
// that answers is never down.
const sentinelTiming = "sentinel down-after-milliseconds faults 1500\n" +
	"sentinel failover-timeout faults 2000\n"

// syncAtOnce makes a master send its data to a replica that connects at
// once, not after diskless replication's five-second wait for others.
var syncAtOnce = []string{"--repl-diskless-sync-delay", "0"}

// replicaOf is the arguments of a server that starts as r's replica.
func replicaOf(r *redisServer) []string {
	return append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(r.port)}, syncAtOnce...)
}

func startSentinels(t *testing.T) *sentinelSetup {
	t.Helper()
	s := &sentinelSetup{master: startRedisWith(t, freePort(t), syncAtOnce...)}
	s.replica = startRedisWith(t, freePort(t), replicaOf(s.master)...)
	waitLong(t, "the replica is in sync", func() bool {
		return s.replica.field(t, "info replication", "master_link_status") == "up"
	})
	s.switches = make([]atomic.Int64, 3)
	for i := range 3 {
		addr := runSentinel(t, fmt.Sprintf("sentinel monitor faults 127.0.0.1 %d 2\n%s", s.master.port, sentinelTiming))
		c := redis.NewSentinelClient(&redis.Options{Addr: addr})
		announcements := c.Subscribe(context.Background(), "+switch-master")
		if _, err := announcements.Receive(context.Background()); err != nil {
			t.Fatal(err)
		}
		go func() {
			for range announcements.Channel() {
				s.switches[i].Add(1)
			}
		}()
		t.Cleanup(func() { announcements.Close(); c.Close() })
		s.sentinels, s.clients = append(s.sentinels, addr), append(s.clients, c)
	}
	// Sentinels find each other and the replica through hello messages,
	// every two seconds.
	waitLong(t, "the sentinels see each other and the replica", func() bool { return s.ready(t) })
	return s
}

// runSentinel runs a sentinel on a free loopback port with these lines of
// configuration, and returns its address once it listens. Its log goes to
// the test's if the test fails.
func runSentinel(t *testing.T, conf string) string {
	t.Helper()
	port := freePort(t)
	dir := t.TempDir()
	path, log := filepath.Join(dir, "sentinel.conf"), filepath.Join(dir, "sentinel.log")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n%s", port, dir, log, conf)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("redis-server", path, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			data, _ := os.ReadFile(log)
			t.Logf("sentinel %d's log:\n%s", port, data)
		}
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	waitForPort(t, addr)
	return addr
}

// waitLong is eventually for what Redis does on timers of its own
// (replication, sentinel hellos every 2s, failover): up to 30 seconds.
func waitLong(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}
