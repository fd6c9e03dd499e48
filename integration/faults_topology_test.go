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
// a renewal interval of the new master's promotion.
func TestFaultsSentinel(t *testing.T) {
	t.Parallel() // see TestFaults
	s := startSentinels(t)
	sentinels := strings.Join(s.sentinels, " ")
	e := startFaultFleet(t, faultSite{masterName: "faults", onError: "open"}, tenantCaps, sentinels, sentinels, sentinels)
	// One failover by default; three in the long run. Three in one run
	// found the flapping (go-redis's dial breaker, caught deterministically
	// by TestFirstCallAfterManyFailedDials), but on a busy machine the
	// sentinels sometimes fail the new master back to the old one after
	// the third, a second failover this test did not cause (docs/fleet.md).
	failovers := 1
	if os.Getenv("INFLIGHT_FAULTS_LONG") != "" {
		failovers = 3
	}
	// An instance learns of the promotion from the sentinels a moment
	// after it, and its last call to the dead master leaves Redis alone for
	// the store's back-off (a second, see book.available), admitting
	// locally meanwhile (on_error open): the bound adds that back-off to
	// the renewal interval. Measured today 1.3–1.7 s in 5 of 6 runs, the
	// code before this store changes included.
	bound := e.renewalBound() + storeBackOff
	cycles := e.repeat(failovers, bound, func(e *faultEnv) time.Time {
		return s.failover(t)
	})
	printTable(t, []windows{e.checkCycles(fmt.Sprintf("Sentinel: master SIGKILLed, replica promoted, %d times", failovers), cycles, bound, true)})
	e.wantOutages(failovers)
}

// failover kills the master once the sentinels can promote its replica,
// waits until they did, and returns then; the old master comes back as the
// new one's replica.
func (s *sentinelSetup) failover(t *testing.T) (promoted time.Time) {
	t.Helper()
	c := redis.NewSentinelClient(&redis.Options{Addr: s.sentinels[0]})
	defer c.Close()
	waitLong(t, "the sentinels see the replica up and in sync", func() bool {
		replicas, _ := c.Replicas(context.Background(), "faults").Result()
		return s.replica.field(t, "info replication", "master_link_status") == "up" &&
			len(replicas) > 0 && slices.ContainsFunc(replicas, func(r map[string]string) bool {
			return r["port"] == strconv.Itoa(s.replica.port) && r["flags"] == "slave"
		})
	})
	killed := time.Now()
	s.master.stop() // SIGKILL
	waitLong(t, "Sentinel promotes the replica", func() bool { return s.masterAddr(t) == s.replica.addr })
	promoted = time.Now()
	t.Logf("the replica was promoted %v after the master was killed", promoted.Sub(killed).Round(10*time.Millisecond))
	s.master.args = []string{"--replicaof", "127.0.0.1", strconv.Itoa(s.replica.port)}
	s.master.start(t)
	s.master, s.replica = s.replica, s.master
	return promoted
}

// TestFaultsTLSRestart restarts a Redis that speaks only TLS (once; three times in the long run),
// with requests waiting: each restart is one outage, logged once each way,
// and costs what a plain restart does. go-redis does not check pooled TLS
// connections before reuse as it checks plain TCP ones: each connection
// pooled before a restart failed its next call with EOF, which was logged
// as a new outage, cut the back-off short, refused (on_error closed) or
// admitted locally (open) after Redis answered again.
func TestFaultsTLSRestart(t *testing.T) {
	t.Parallel() // see TestFaults
	pki := newTestPKI(t)
	for _, onError := range []string{"closed", "open"} {
		t.Run(onError, func(t *testing.T) {
			port := freePort(t)
			r := startRedisWith(t, port, tlsOnly(port, pki, "no")...)
			site := faultSite{onError: onError, tls: []string{"tls_ca " + pki.ca, "tls_server_name redis.test"}}
			e := startFaultFleet(t, site, tenantCaps, r.addr, r.addr, r.addr)
			restarts := 1 // three in the long run; one found the EOF outages already
			if os.Getenv("INFLIGHT_FAULTS_LONG") != "" {
				restarts = 3
			}
			cycles := e.repeat(restarts, e.renewalBound(), func(e *faultEnv) time.Time {
				r.stop()
				time.Sleep(e.timing.fault)
				r.start(t)
				return time.Now()
			})
			printTable(t, []windows{e.checkCycles(fmt.Sprintf("TLS: restart with empty data (down 1 s), %d times, on_error %s", restarts, onError), cycles, e.renewalBound(), true)})
			e.wantOutages(restarts)
		})
	}
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
}

func startSentinels(t *testing.T) *sentinelSetup {
	t.Helper()
	s := &sentinelSetup{master: startRedis(t)}
	s.replica = startRedisWith(t, freePort(t), "--replicaof", "127.0.0.1", strconv.Itoa(s.master.port))
	waitLong(t, "the replica is in sync", func() bool {
		return s.replica.field(t, "info replication", "master_link_status") == "up"
	})
	for range 3 {
		s.sentinels = append(s.sentinels, runSentinel(t, fmt.Sprintf(
			"sentinel monitor faults 127.0.0.1 %d 2\n"+
				"sentinel down-after-milliseconds faults 500\n"+
				"sentinel failover-timeout faults 2000\n", s.master.port)))
	}
	// Sentinels find each other and the replica through hello messages,
	// every two seconds.
	c := redis.NewSentinelClient(&redis.Options{Addr: s.sentinels[0]})
	defer c.Close()
	waitLong(t, "the sentinels see each other and the replica", func() bool {
		m, _ := c.Master(context.Background(), "faults").Result()
		return m["num-other-sentinels"] == "2" && m["num-slaves"] == "1"
	})
	return s
}

// runSentinel runs a sentinel on a free loopback port with these lines of
// configuration, and returns its address once it listens.
func runSentinel(t *testing.T, conf string) string {
	t.Helper()
	port := freePort(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "sentinel.conf")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\n%s", port, dir, conf)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("redis-server", path, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	waitForPort(t, addr)
	return addr
}

// waitLong is eventually for what Redis does on timers of its own
// (replication, sentinel hellos every 2s, failover): up to 30 seconds.
func waitLong(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// masterAddr asks a sentinel which server is the master now.
func (s *sentinelSetup) masterAddr(t testing.TB) string {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.sentinels[0]})
	defer c.Close()
	addr, err := c.GetMasterAddrByName(context.Background(), "faults").Result()
	if err != nil {
		return ""
	}
	return addr[0] + ":" + addr[1]
}
