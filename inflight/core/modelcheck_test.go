package core

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"

	"github.com/caddy-inflight/caddy-inflight/inflight/internal/fleetref"
)

// The engine and the reference model (model_test.go) side by side: a
// scenario is a random handler config and a sequence of events (arrivals,
// releases, clients leaving, time passing, reloads, a second release),
// played on a gate in virtual time and on the model. After every event
// each request's verdict (outcome, refusing limit, time waited) and every
// count (units per key, per limit, the total, the waiters) must be the
// model's. The model grants the first waiter in the queue order that fits
// beyond the head's reservation, so an agreement checks at once that no
// cap is exceeded, that no waiter that fits is kept waiting (work
// conservation), that each grant follows the queue order (priority,
// aging, fair tags, deadlines, early refusal), and, at the end of each
// scenario, that every unit comes back.
//
// A disagreement is shrunk to a short sequence and printed as JSON;
// INFLIGHT_MODEL_CASE=<that JSON> replays it. INFLIGHT_MODEL_CASES sets the
// number of random scenarios (default 2000); FuzzEngineModel explores
// more.

// mScenario is a case: a config, the keys, and the events.
type mScenario struct {
	Config  mConfig
	Keys    int                      // per limit: k0, k1, ...
	Weights map[string]float64       `json:",omitempty"` // with fair: the fair key's weight (the weight template)
	Classes map[string]limiter.Class `json:",omitempty"` // with fair: the fair key's class
	// Ledger puts the zone in a fleet of one instance, its ledger the
	// reference's (internal/fleetref): it admits within allowances, and
	// must decide as the model does all the same.
	Ledger bool `json:",omitempty"`
	// Instances: a fleet's (modelfleet_test.go); 0: one.
	Instances int `json:",omitempty"`
	// Plays: how many times a fleet's found case is played, where its
	// promise breaks in too few interleavings for foundReplays to catch
	// it surely (0: foundReplays).
	Plays  int `json:",omitempty"`
	Events []mEvent
}

// mEvent is one event. Pick chooses among the requests it applies to
// (admitted ones for a release, waiters for a client leaving, released
// ones for a second release), modulo their number.
type mEvent struct {
	Kind   string // arrive, release, leave, pass, reload, again
	Keys   []string
	Cost   int64
	Class  limiter.Class
	Left   time.Duration // arrive: its deadline's distance (0: none)
	Pick   int
	Used   int64         // release: the units it was found to use (0: its own)
	D      time.Duration // pass
	Config *mConfig      `json:",omitempty"` // reload
	At     int           `json:",omitempty"` // arrive, on a fleet: the instance
}

func (sc *mScenario) String() string {
	b, _ := json.Marshal(sc)
	return string(b)
}

// mSource draws the scenario's choices: from a seeded generator, or from
// a fuzzer's bytes (zeros once they run out).
type mSource struct {
	rng  *rand.Rand
	data []byte
}

func (s *mSource) intn(n int) int {
	if s.rng != nil {
		return s.rng.IntN(n)
	}
	if len(s.data) == 0 {
		return 0
	}
	v := int(s.data[0])
	if n > 256 && len(s.data) > 1 {
		v = v<<8 | int(s.data[1])
		s.data = s.data[1:]
	}
	s.data = s.data[1:]
	return v % n
}

func (s *mSource) chance(percent int) bool { return s.intn(100) < percent }

func (s *mSource) ms(lo, hi int) time.Duration {
	return time.Duration(lo+s.intn(hi-lo+1)) * time.Millisecond
}

// genScenario draws a scenario: 1–3 limits with fixed or per-request caps,
// maybe a total, costs 1–4, fair or not, waits, deadlines, early refusal.
func genScenario(src *mSource) *mScenario {
	dims := 1 + src.intn(3)
	sc := &mScenario{Keys: 1 + src.intn(3)}
	c := &sc.Config
	c.Dims, c.Fair = dims, -1
	c.Fixed, c.OwnMax = make([]int64, dims), make([]map[string]int64, dims)
	for d := range dims {
		if src.chance(30) {
			c.OwnMax[d] = map[string]int64{}
		} else {
			c.Fixed[d] = 1
		}
	}
	c.HasTotal = src.chance(50)
	if src.chance(50) {
		c.Fair = src.intn(dims)
	}
	c.Early = src.chance(35)
	sc.drawCaps(src, c)
	costs := src.chance(50)
	if c.Fair >= 0 {
		sc.Classes, sc.Weights = map[string]limiter.Class{}, map[string]float64{}
		weighted := src.chance(50)
		for _, k := range sc.keys() {
			sc.Classes[k] = limiter.Class(src.intn(3))
			if weighted {
				sc.Weights[k] = []float64{0.5, 1, 2, 3}[src.intn(4)]
			}
		}
		if !weighted {
			sc.Weights = nil
		}
	}
	for range 20 + src.intn(80) {
		sc.Events = append(sc.Events, sc.drawEvent(src, costs))
	}
	return sc
}

// drawCaps draws the caps of c's limits (of the kind each has), its total
// (if it has one) and its waiting bounds: at load, and at each reload.
func (sc *mScenario) drawCaps(src *mSource, c *mConfig) {
	for d := range c.Dims {
		if c.OwnMax[d] != nil {
			for _, k := range sc.keys() {
				c.OwnMax[d][k] = 1 + int64(src.intn(4))
			}
		} else {
			c.Fixed[d] = 1 + int64(src.intn(4))
		}
	}
	if c.HasTotal {
		c.Total = 1 + int64(src.intn(8))
	}
	c.MaxKeys = 0
	if src.chance(20) {
		c.MaxKeys = 1 + int64(src.intn(3))
	}
	switch n := src.intn(100); {
	case n < 15:
		c.Wait = 0 // refused at once
	case n < 45:
		c.Wait = src.ms(30000, 150000) // long enough to age past a class
	default:
		c.Wait = src.ms(500, 20000)
	}
	c.MaxWaiting = 2 + src.intn(10)
	c.PerKey = 0
	if src.chance(25) { // at most max_waiting: a config refuses more
		c.PerKey = 1 + src.intn(min(3, c.MaxWaiting))
	}
}

// keys are the keys a limit's requests have: k0, k1, ..., and "" (none).
func (sc *mScenario) keys() []string {
	out := []string{""}
	for i := range sc.Keys {
		out = append(out, fmt.Sprint("k", i))
	}
	return out
}

func (sc *mScenario) drawEvent(src *mSource, costs bool) mEvent {
	switch n := src.intn(100); {
	case n < 40:
		e := mEvent{Kind: "arrive", Cost: 1, Class: limiter.Class(src.intn(3))}
		for range sc.Config.Dims {
			k := ""
			if !src.chance(10) {
				k = fmt.Sprint("k", src.intn(sc.Keys))
			}
			e.Keys = append(e.Keys, k)
		}
		if costs {
			e.Cost = 1 + int64(src.intn(4))
		}
		if src.chance(30) {
			e.Left = src.ms(50, 10000)
		}
		return e
	case n < 65:
		e := mEvent{Kind: "release", Pick: src.intn(16)}
		if src.chance(30) {
			e.Used = int64(src.intn(9))
		}
		return e
	case n < 82:
		d := src.ms(1, 2000)
		if src.chance(10) {
			d = src.ms(10000, 45000) // long enough to age
		}
		return mEvent{Kind: "pass", D: d}
	case n < 92:
		return mEvent{Kind: "leave", Pick: src.intn(16)}
	case n < 96:
		c := sc.Config
		c.Fixed = slices.Clone(c.Fixed)
		c.OwnMax = make([]map[string]int64, c.Dims)
		for d := range c.Dims {
			if sc.Config.OwnMax[d] != nil {
				c.OwnMax[d] = map[string]int64{}
			}
		}
		sc.drawCaps(src, &c)
		return mEvent{Kind: "reload", Config: &c}
	}
	return mEvent{Kind: "again", Pick: src.intn(16)}
}

// handler is the gate config that c stands for.
func (sc *mScenario) handler(c *mConfig) *Config {
	cfg := &Config{Total: int(c.Total), MaxKeys: int(c.MaxKeys), Wait: caddy.Duration(c.Wait),
		MaxWaiting: c.MaxWaiting, MaxWaitingPerKey: c.PerKey, Priority: "{p}"}
	for d := range c.Dims {
		l := Limit{Name: fmt.Sprint("l", d), Key: fmt.Sprintf("{k%d}", d), Max: Max{Fixed: c.Fixed[d]}}
		if c.OwnMax[d] != nil {
			l.Max = Max{Placeholder: "{max}"}
		}
		cfg.Limits = append(cfg.Limits, l)
	}
	if c.Fair >= 0 {
		cfg.Fair = fmt.Sprint("l", c.Fair)
		if sc.Weights != nil {
			cfg.Weight = "{w}"
		}
	}
	return cfg
}

// eRequest is a request on the engine's side.
type eRequest struct {
	gate     *Gate
	ticket   *Ticket
	cancel   context.CancelFunc
	done     chan Verdict
	verdict  *Verdict
	released bool
}

// answer reads er's verdict if it came.
func (er *eRequest) answer() {
	if er.verdict == nil {
		select {
		case v := <-er.done:
			er.verdict = &v
		default:
		}
	}
}

// mRun plays a scenario on the engine and the model.
type mRun struct {
	t     *testing.T
	sc    *mScenario
	m     *model
	gate  *Gate
	label string
	reqs  []*eRequest
}

var modelZones atomic.Int64

// mTally counts what the scenarios played, so that a run shows it met
// every rule it checks.
type mTally map[string]int

func (t mTally) add(req *mRequest) {
	switch o := req.outcome; {
	case o == limiter.Admitted && req.waited > 0:
		t["admitted after waiting"]++
	case o == limiter.Admitted:
		t["admitted at once"]++
	case o == limiter.Timeout && req.waited == 0:
		t["refused early"]++
	case o == limiter.Timeout:
		t["timed out"]++
	case o == limiter.Full && req.dim == limiter.TotalDim:
		t["refused by the total"]++
	case o == limiter.Full:
		t["refused by a key's cap"]++
	case o == limiter.KeysFull:
		t["refused by a key bound"]++
	case o == limiter.QueueFull:
		t["queue full"]++
	case o == limiter.Aborted:
		t["left while waiting"]++
	}
	if req.charged {
		t["fair grants"]++
	}
}

// play runs sc in a bubble and returns the first disagreement, "" if none;
// tally, if not nil, counts its requests' verdicts.
func play(t *testing.T, sc *mScenario, tally mTally) (problem string) {
	synctest.Test(t, func(t *testing.T) {
		r := &mRun{t: t, sc: sc, label: fmt.Sprint("model-", modelZones.Add(1))}
		r.m = newModel(sc.Config, time.Now())
		r.gate = joinTestGate(t, r.label, sc.handler(&sc.Config), Edge{UnitMax: true, Costs: true, EarlyRefusal: sc.Config.Early})
		if sc.Ledger {
			r.gate.zone.SetLedger(fleetref.NewFleet().Join())
		}
		defer func() { r.gate.Leave() }()
		defer r.closeLedger()
		for i, e := range sc.Events {
			r.step(e)
			if p := r.compare(); p != "" {
				problem = fmt.Sprintf("after event %d (%s): %s", i, e.Kind, p)
				r.endEngine()
				return
			}
		}
		problem = r.end()
		for _, req := range r.m.reqs {
			if tally != nil {
				tally.add(req)
			}
		}
	})
	return problem
}

// step plays e on both sides, and waits until the engine has done with it.
func (r *mRun) step(e mEvent) {
	m := r.m
	switch e.Kind {
	case "arrive":
		// Each arrival a microsecond later: the n-th one's waits end at
		// n µs past a millisecond, so no two waits end at once.
		r.pass(time.Microsecond)
		r.arrive(e)
	case "release":
		if req, er := r.pick(e.Pick, mAdmitted); req != nil {
			req.used, er.ticket.Slot.Used = e.Used, e.Used
			er.gate.Release(er.ticket)
			er.released = true
			m.release(req)
		}
	case "leave":
		if req, er := r.pick(e.Pick, mWaiting); req != nil {
			er.cancel()
			synctest.Wait()
			m.leave(req, limiter.Aborted)
		}
	case "pass":
		r.pass(e.D)
	case "reload":
		old := r.gate
		r.gate = joinTestGate(r.t, r.label, r.sc.handler(e.Config), Edge{UnitMax: true, Costs: true, EarlyRefusal: r.sc.Config.Early})
		synctest.Wait() // the model lets the waiters in after each step
		old.Leave()
		m.reload(*e.Config)
	case "again":
		var released []*eRequest
		for i, req := range m.reqs {
			if req.state == mDone && req.outcome == limiter.Admitted {
				released = append(released, r.reqs[i])
			}
		}
		if len(released) > 0 {
			releaseAgain(r.t, released[e.Pick%len(released)])
		}
	}
	synctest.Wait()
}

// releaseAgain releases er a second time, which must panic.
func releaseAgain(t *testing.T, er *eRequest) {
	defer func() {
		if recover() == nil {
			t.Errorf("a second release did not panic")
		}
	}()
	er.gate.Release(er.ticket)
}

// pass moves time on by d: waits end on the way, each at its time.
func (r *mRun) pass(d time.Duration) {
	m := r.m
	to := m.now.Add(d)
	for {
		var next *mRequest
		for _, req := range m.reqs {
			if req.state == mWaiting && !req.arrived.Add(req.wait).After(to) && (next == nil || req.arrived.Add(req.wait).Before(next.arrived.Add(next.wait))) {
				next = req
			}
		}
		if next == nil {
			break
		}
		m.now = next.arrived.Add(next.wait)
		m.leave(next, limiter.Timeout)
	}
	m.now = to
	time.Sleep(d)
	synctest.Wait()
}

// arrive starts a request's admission on the engine, and plays it on the
// model.
func (r *mRun) arrive(e mEvent) {
	m := r.m
	er, own, class, weight := r.sc.admitOn(r.gate, &m.cfg, e)
	req := &mRequest{id: len(m.reqs), keys: e.Keys, max: own, cost: e.Cost, class: class, weight: weight}
	r.reqs = append(r.reqs, er)
	synctest.Wait()
	m.arrive(req, e.Left)
}

// admitOn starts e's admission on g under cfg, in the background: its
// caps where a limit takes them per request, its cost, its class and
// weight (with fair, its fair key's), its deadline. It returns the
// engine's side, its own cap in each limit (0: the limit's), and the
// class and weight the model gives it.
func (sc *mScenario) admitOn(g *Gate, cfg *mConfig, e mEvent) (er *eRequest, own []int64, class limiter.Class, weight float64) {
	class, w := e.Class, ""
	if cfg.Fair >= 0 {
		key := e.Keys[cfg.Fair]
		class = sc.Classes[key]
		weight = mClassWeight[class]
		if sc.Weights != nil {
			weight = sc.Weights[key]
			w = strconv.FormatFloat(weight, 'g', -1, 64)
		}
	}
	er = &eRequest{gate: g, done: make(chan Verdict, 1)}
	er.ticket = g.newTicket(e.Keys...)
	own = make([]int64, cfg.Dims)
	for d := range cfg.Dims {
		if cfg.OwnMax[d] != nil {
			own[d] = cfg.OwnMax[d][e.Keys[d]]
			er.ticket.Req.Max[d] = own[d]
		}
	}
	er.ticket.Req.Cost = e.Cost
	ctx, cancel := context.WithCancel(context.Background())
	er.cancel = cancel
	go func() {
		if e.Left > 0 {
			er.done <- g.AdmitWithin(ctx, er.ticket, class.String(), w, e.Left)
		} else {
			er.done <- g.Admit(ctx, er.ticket, class.String(), w)
		}
	}()
	return er, own, class, weight
}

// pick returns the Pick-th of the model's requests in state s, and its
// engine side.
func (r *mRun) pick(pick int, s mState) (*mRequest, *eRequest) {
	var in []*mRequest
	for _, req := range r.m.reqs {
		if req.state == s {
			in = append(in, req)
		}
	}
	if len(in) == 0 {
		return nil, nil
	}
	req := in[pick%len(in)]
	return req, r.reqs[req.id]
}

// compare returns how the engine differs from the model, "" if it does
// not.
func (r *mRun) compare() string {
	m := r.m
	for i, req := range m.reqs {
		er := r.reqs[i]
		er.answer()
		decided := req.state != mWaiting
		switch {
		case !decided && er.verdict != nil:
			return fmt.Sprintf("request %d %q: the model has it waiting, the engine answered %s", i, req.keys, verdictString(er.verdict.Result))
		case decided && er.verdict == nil:
			return fmt.Sprintf("request %d %q: the model answered %s, the engine has it waiting", i, req.keys, modelString(req))
		case decided && !sameVerdict(req, er.verdict.Result):
			return fmt.Sprintf("request %d %q (cost %d): the model answered %s, the engine %s", i, req.keys, req.cost, modelString(req), verdictString(er.verdict.Result))
		}
	}
	st := r.gate.zone.State(limiter.Look{Dims: true})
	for d := range m.cfg.Dims {
		var sum int64
		for _, k := range r.sc.keys()[1:] {
			if got, want := keyUnits(r.gate, m.cfg.Dims, d, k), m.count[d][k]; got != want {
				return fmt.Sprintf("limit %d key %s holds %d units, the model %d", d, k, got, want)
			}
			sum += m.count[d][k]
		}
		if got := st.Dims[d].Units; got != sum {
			return fmt.Sprintf("limit %d holds %d units, the model %d", d, got, sum)
		}
	}
	if m.cfg.HasTotal {
		if got := st.Total.Units; got != m.total {
			return fmt.Sprintf("the total holds %d units, the model %d", got, m.total)
		}
	}
	if got, want := st.Waiting, m.queued(); got != want {
		return fmt.Sprintf("%d requests wait, the model has %d", got, want)
	}
	return ""
}

// end lets every waiter go and releases every admitted request, on both
// sides, then checks that every unit came back.
func (r *mRun) end() string {
	for _, req := range r.m.reqs {
		switch req.state {
		case mWaiting:
			r.m.leave(req, limiter.Aborted)
		case mAdmitted:
			r.m.release(req)
		}
	}
	r.endEngine()
	if p := r.compare(); p != "" {
		return "at the end: " + p
	}
	if p := leftIn(r.gate); p != "" {
		return "at the end, " + p
	}
	return ""
}

// leftIn returns what g's zone still holds or has waiting, "" if nothing.
func leftIn(g *Gate) string {
	st := g.zone.State(limiter.Look{Dims: true})
	for d, ds := range st.Dims {
		if ds.Units != 0 || ds.Keys != 0 {
			return fmt.Sprintf("limit %d holds %d units of %d keys", d, ds.Units, ds.Keys)
		}
	}
	if st.Total.Units != 0 || st.Waiting != 0 {
		return fmt.Sprintf("the total holds %d, %d wait", st.Total.Units, st.Waiting)
	}
	return ""
}

// keyUnits is the units key k holds in limit d of g's n limits, as a
// request's local level reads them.
func keyUnits(g *Gate, n, d int, k string) int64 {
	req := limiter.Request{Keys: make([]string, n), Max: make([]int64, n), Limits: g.limits}
	req.Keys[d] = k
	return g.zone.Levels(&req, false, nil)[d].InFlight
}

// closeLedger closes a zone in a fleet and lets its asker give back what
// it holds and end, so that the bubble can end.
func (r *mRun) closeLedger() {
	if r.sc.Ledger {
		r.gate.zone.Close()
		time.Sleep(time.Second)
	}
}

// endEngine lets every waiter go and releases every admitted request on
// the engine, in the order the model's end does: a waiter a release
// admits comes later in it.
func (r *mRun) endEngine() {
	for _, er := range r.reqs {
		er.finish()
	}
}

// finish lets er go if it waits, and releases it if it was admitted and
// is not released yet.
func (er *eRequest) finish() {
	er.answer()
	if er.verdict == nil {
		er.cancel()
		synctest.Wait()
		er.answer()
	}
	if er.verdict != nil && er.verdict.Outcome == limiter.Admitted && !er.released {
		er.gate.Release(er.ticket)
		er.released = true
		synctest.Wait()
	}
	er.cancel()
}

func sameVerdict(req *mRequest, res limiter.Result) bool {
	if req.outcome != res.Outcome || req.waited != res.Waited {
		return false
	}
	return req.outcome == limiter.Admitted || req.dim == res.Dim
}

func verdictString(res limiter.Result) string {
	return fmt.Sprintf("outcome %d dim %d waited %s", res.Outcome, res.Dim, res.Waited)
}

func modelString(req *mRequest) string {
	return fmt.Sprintf("outcome %d dim %d waited %s", req.outcome, req.dim, req.waited)
}

// shrink removes events from sc while play still finds a problem, and
// returns the shortest it found and its problem.
func shrink(t *testing.T, sc *mScenario, problem string, play func(*testing.T, *mScenario) string) (*mScenario, string) {
	for changed := true; changed; {
		changed = false
		for i := len(sc.Events) - 1; i >= 0; i-- {
			try := *sc
			try.Events = slices.Delete(slices.Clone(sc.Events), i, i+1)
			if p := play(t, &try); p != "" {
				sc, problem, changed = &try, p, true
			}
		}
	}
	return sc, problem
}

// check plays sc and, on a disagreement, fails with the shortest case
// that shows it.
func check(t *testing.T, what string, sc *mScenario, tally mTally) {
	t.Helper()
	if p := play(t, sc, tally); p != "" {
		small, p := shrink(t, sc, p, func(t *testing.T, sc *mScenario) string { return play(t, sc, nil) })
		t.Fatalf("%s: the engine differs from the model %s\nreplay: INFLIGHT_MODEL_CASE='%s' go test -run TestEngineMatchesModel ./inflight/core", what, p, small)
	}
}

// TestEngineMatchesModel plays random scenarios (2,000 by default) on the
// engine and the model.
func TestEngineMatchesModel(t *testing.T) {
	if c := os.Getenv("INFLIGHT_MODEL_CASE"); c != "" {
		var sc mScenario
		if err := json.NewDecoder(strings.NewReader(c)).Decode(&sc); err != nil {
			t.Fatal(err)
		}
		check(t, "the case given", &sc, nil)
		return
	}
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("INFLIGHT_MODEL_CASES")); err == nil {
		n = v
	}
	tally := mTally{}
	for seed := range n {
		sc := genScenario(&mSource{rng: rand.New(rand.NewPCG(uint64(seed), 38))})
		sc.Ledger = seed%3 == 2
		check(t, fmt.Sprint("seed ", seed), sc, tally)
	}
	t.Logf("%d scenarios: %v", n, tally)
	if n >= 2000 {
		for _, k := range []string{"admitted after waiting", "admitted at once", "refused early", "timed out", "refused by the total",
			"refused by a key's cap", "refused by a key bound", "queue full", "left while waiting", "fair grants"} {
			if tally[k] == 0 {
				t.Errorf("no request was %s: the scenarios no longer check that rule", k)
			}
		}
	}
}

// TestEngineMatchesModelFoundCases plays the scenarios in testdata/model:
// each is a disagreement the fuzzer found once, shrunk, and named for it.
func TestEngineMatchesModelFoundCases(t *testing.T) {
	playFound(t, "testdata/model", func(t *testing.T, what string, sc *mScenario) { check(t, what, sc, nil) })
}

// playFound checks each scenario in dir, a subtest each.
func playFound(t *testing.T, dir string, check func(t *testing.T, what string, sc *mScenario)) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios in %s: %v", dir, err)
	}
	for _, name := range files {
		t.Run(strings.TrimSuffix(filepath.Base(name), ".json"), func(t *testing.T) {
			b, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			var sc mScenario
			if err := json.Unmarshal(b, &sc); err != nil {
				t.Fatal(err)
			}
			check(t, name, &sc)
		})
	}
}

// FuzzEngineModel draws scenarios from the fuzzer's bytes.
func FuzzEngineModel(f *testing.F) {
	for seed := range 4 {
		b := make([]byte, 400)
		rng := rand.New(rand.NewPCG(uint64(seed), 38))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sc := genScenario(&mSource{data: data})
		sc.Ledger = len(data)%3 == 2
		check(t, "fuzzed", sc, nil)
	})
}
