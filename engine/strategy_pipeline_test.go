package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
)

// closedLoop simulates c concurrent clients against r: each step ranks, adds the pick's load, and once c
// requests are in flight completes a random one. It returns the picks per target.
func closedLoop(r *Route, p *Pick, steps, c int, key func(i int) []byte) []int {
	counts := make([]int, len(r.Targets))
	var out [maxTargets]int
	var inflight []int
	rnd := rand.New(rand.NewPCG(7, 7))
	for i := 0; i < steps; i++ {
		if key != nil {
			p.Key = key(i)
		}
		r.Strategy.Rank(p, out[:])
		t := out[0]
		if rec, ok := r.Strategy.(Recorder); ok {
			rec.Routed(p, t)
		}
		counts[t]++
		r.Targets[t].Provider.inflight.Add(1)
		inflight = append(inflight, t)
		if len(inflight) >= c {
			j := rnd.IntN(len(inflight))
			r.Targets[inflight[j]].Provider.inflight.Add(-1)
			inflight[j] = inflight[len(inflight)-1]
			inflight = inflight[:len(inflight)-1]
		}
	}
	for _, t := range inflight {
		r.Targets[t].Provider.inflight.Add(-1)
	}
	return counts
}

func TestPipelineArgmaxAndTies(t *testing.T) {
	r := testRoute(t, "pipeline", []float64{1, 1, 1, 1}, "")
	var buf [maxTargets]int
	var p Pick
	allEligible(r, &p, buf[:])
	// Everything equal: a uniform random tie-break.
	p.Key = []byte("cold prompt")
	assertShares(t, share(r, &p, 8000), []float64{.25, .25, .25, .25}, 0.03)
	// One target holds the prefix: argmax takes it every time.
	r.Strategy.(*pipeline).tries[2].Insert([]byte("cold prompt"))
	assertShares(t, share(r, &p, 1000), []float64{0, 0, 1, 0}, 0)
	// Load steers: the holder at 5x the others' load loses when the cache term cannot cover it.
	r2 := testRoute(t, "pipeline", []float64{1, 1}, "cache_factor = 0.5")
	var p2 Pick
	allEligible(r2, &p2, buf[:])
	p2.Key = []byte("prompt")
	r2.Strategy.(*pipeline).tries[0].Insert([]byte("prompt"))
	r2.Targets[0].Provider.inflight.Store(4) // load term 1/5 + cache 0.5 = 0.7 < 1
	if got, d := rank(r2, &p2); got != 1 || d.Reason != ReasonScore {
		t.Fatalf("got %d %s", got, d.Reason)
	}
}

// TestPipelineSharedPrefixNotCounted: the cache term counts only what a target holds beyond the prefix every
// eligible target holds (multi-turn). A conversation whose first half is an agent prompt on every
// engine stays on the engine holding its history at a load imbalance that moved it when the shared half
// counted (2.2 x 1/3 + 2.1 x 0.98 < 2.2 + 2.1 x 0.49), and still leaves it when the imbalance grows (the
// load term can always win: load_factor > cache_factor; here past 2.2 x 1/(load+1) + 2.1 < 2.2, load 21);
// a prompt every target holds whole is decided by load alone.
func TestPipelineSharedPrefixNotCounted(t *testing.T) {
	agent := strings.Repeat("agent prompt ", 40)   // 520 bytes on every target
	history := strings.Repeat("conversation ", 40) // 520 bytes on target 0 only
	key := []byte(agent + history + "next question")
	f := func(loads []int64, want []float64) {
		t.Helper()
		// Off: ranking one prompt 3000 times would make it hot (TestPipelineHotPrefix).
		r := testRoute(t, "pipeline", []float64{1, 1, 1, 1}, "hot_window = 0")
		var buf [maxTargets]int
		var p Pick
		allEligible(r, &p, buf[:])
		p.Key = key
		s := r.Strategy.(*pipeline)
		s.tries[0].Insert([]byte(agent + history))
		for i := 1; i < 4; i++ {
			s.tries[i].Insert([]byte(fmt.Sprintf("%sanother conversation %d", agent, i)))
		}
		for i, l := range loads {
			r.Targets[i].Provider.inflight.Store(l)
		}
		assertShares(t, share(r, &p, 3000), want, 0.04)
	}
	f([]int64{2, 0, 0, 0}, []float64{1, 0, 0, 0})
	f([]int64{5, 1, 1, 1}, []float64{1, 0, 0, 0})
	f([]int64{24, 0, 0, 0}, []float64{0, 1. / 3, 1. / 3, 1. / 3})
	// Every target holds the whole prompt: no cache preference, the least loaded wins, ties at random.
	key = []byte(agent)
	f([]int64{0, 0, 0, 0}, []float64{.25, .25, .25, .25})
	f([]int64{1, 1, 0, 1}, []float64{0, 0, 1, 0})
}

// TestPipelineHotPrefix: with hot_window, a prefix that 85% of the requests share spreads over every
// target (its cache term is divided by the engines its share fills) while a prefix of a few percent of the
// traffic keeps one holder; without it, the hot prefix stays on the holders it first reached.
func TestPipelineHotPrefix(t *testing.T) {
	f := func(params string, wantHotOn, wantColdOn int) {
		t.Helper()
		r := testRoute(t, "pipeline", []float64{1, 1, 1, 1}, params)
		var buf [maxTargets]int
		var p Pick
		allEligible(r, &p, buf[:])
		rnd := rand.New(rand.NewPCG(1, 2))
		hot, cold := make([]int, 4), make([]int, 4)
		var out [maxTargets]int
		var inflight []int
		for i := 0; i < 20000; i++ {
			kind := 0 // 0 hot, 1 the cold group, 2 a unique prompt
			switch x := rnd.IntN(100); {
			case x < 85:
				p.Key = []byte(fmt.Sprintf("%s question %d", strings.Repeat("hot system prompt ", 20), i))
			case x < 88:
				kind = 1
				p.Key = []byte(fmt.Sprintf("%s question %d", strings.Repeat("a quiet system prompt ", 20), i))
			default:
				kind = 2
				p.Key = []byte(fmt.Sprintf("unique %d %s", i, strings.Repeat("x", 300)))
			}
			r.Strategy.Rank(&p, out[:])
			target := out[0]
			r.Strategy.(Recorder).Routed(&p, target)
			if i >= 2000 {
				switch kind {
				case 0:
					hot[target]++
				case 1:
					cold[target]++
				}
			}
			r.Targets[target].Provider.inflight.Add(1)
			inflight = append(inflight, target)
			if len(inflight) >= 24 {
				j := rnd.IntN(len(inflight))
				r.Targets[inflight[j]].Provider.inflight.Add(-1)
				inflight[j] = inflight[len(inflight)-1]
				inflight = inflight[:len(inflight)-1]
			}
		}
		on := func(c []int) int {
			n, sum := 0, 0
			for _, v := range c {
				sum += v
			}
			for _, v := range c {
				if v*10 >= sum { // at least 10% of the prefix's requests
					n++
				}
			}
			return n
		}
		if on(hot) != wantHotOn || on(cold) != wantColdOn {
			t.Fatalf("%q: hot prefix on %d targets %v, want %d; quiet prefix on %d %v, want %d", params, on(hot), hot, wantHotOn, on(cold), cold, wantColdOn)
		}
	}
	f("load_factor = 2.2\nhot_window = 128", 4, 1)
	f("load_factor = 2.2\nhot_window = 0", 2, 1)
}

// TestPipelineWeightBias: weight = 2 measurably biases traffic toward its target under concurrent load.
func TestPipelineWeightBias(t *testing.T) {
	r := testRoute(t, "pipeline", []float64{2, 1}, "")
	var buf [maxTargets]int
	var p Pick
	allEligible(r, &p, buf[:])
	counts := closedLoop(r, &p, 20000, 8, randomKey)
	ratio := float64(counts[0]) / float64(counts[1])
	t.Logf("weight 2:1 -> picks %v (ratio %.2f)", counts, ratio)
	if ratio < 1.5 {
		t.Fatalf("weight 2 got %.2fx the traffic of weight 1; want a clear bias", ratio)
	}
	// And equal weights do not.
	r = testRoute(t, "pipeline", []float64{1, 1}, "")
	allEligible(r, &p, buf[:])
	counts = closedLoop(r, &p, 20000, 8, randomKey)
	if ratio := float64(counts[0]) / float64(counts[1]); math.Abs(ratio-1) > 0.1 {
		t.Fatalf("equal weights gave ratio %.2f", ratio)
	}
}

// TestPipelineScrapedQueue: a target whose engine reports a deep queue gets less traffic.
func TestPipelineScrapedQueue(t *testing.T) {
	r := testRoute(t, "pipeline", []float64{1, 1, 1}, "")
	var buf [maxTargets]int
	var p Pick
	allEligible(r, &p, buf[:])
	r.Targets[0].Provider.engineLoad = func() int64 { return 40 }
	counts := closedLoop(r, &p, 6000, 6, randomKey)
	if counts[0]*10 > counts[1] {
		t.Fatalf("deep-queue target still got %v", counts)
	}
}

func TestPipelineSessions(t *testing.T) {
	r := testRoute(t, "pipeline", []float64{1, 1, 1}, "session_ttl_secs = 10")
	s := r.Strategy.(*pipeline)
	var buf [maxTargets]int
	var p Pick
	allEligible(r, &p, buf[:])
	now := time.Now().UnixNano()
	p.Now = now
	p.SessionID = []byte("session-1")
	p.Key = []byte("first")
	first, d := rank(r, &p)
	if d.Reason != ReasonScore {
		t.Fatalf("unbound session decided %s", d.Reason)
	}
	s.Routed(&p, first)
	// Sticky even when its target is the busiest and another target holds the prompt.
	r.Targets[first].Provider.inflight.Store(50)
	other := (first + 1) % 3
	p.Key = []byte("second")
	s.tries[other].Insert(p.Key)
	for i := 0; i < 100; i++ {
		p.Now = now + int64(i)*int64(time.Second/10)
		if got, d := rank(r, &p); got != first || d.Reason != ReasonSession {
			t.Fatalf("session moved to %d (%s)", got, d.Reason)
		}
	}
	// Idle past the TTL: re-scored (and would be re-bound by Routed).
	p.Now += int64(11 * time.Second)
	if got, d := rank(r, &p); got == first || d.Reason != ReasonScore {
		t.Fatalf("expired binding still used: %d %s", got, d.Reason)
	}
	// The bound target becomes ineligible: re-scored and re-bound.
	p.Now = now
	s.Routed(&p, first)
	p.Eligible, p.EligibleMask = nil, 0
	for i := range r.Targets {
		if i != first {
			p.Eligible = append(p.Eligible, i)
			p.EligibleMask |= 1 << i
		}
	}
	got, d := rank(r, &p)
	if got == first || d.Reason != ReasonScore {
		t.Fatalf("ineligible bound target used: %d %s", got, d.Reason)
	}
	s.Routed(&p, got)
	allEligible(r, &p, buf[:])
	r.Targets[first].Provider.inflight.Store(0)
	if again, d := rank(r, &p); again != got || d.Reason != ReasonSession {
		t.Fatalf("re-binding did not stick: %d %s", again, d.Reason)
	}
}

func TestSessionTableBounded(t *testing.T) {
	s := newSessions(config.RouteParams{MaxSessions: ptr(100), SessionTTLSecs: ptr(60.0)})
	now := time.Now().UnixNano()
	for i := 0; i < 1000; i++ {
		s.bind([]byte(fmt.Sprint("s", i)), i%3, now+int64(i))
	}
	if n := s.size(); n > 125 {
		t.Fatalf("table grew to %d past its hard cap", n)
	}
	s.prune(now + 2000)
	if n := s.size(); n > 100 {
		t.Fatalf("after prune: %d bindings, max 100", n)
	}
	s.prune(now + int64(61*time.Second))
	if n := s.size(); n != 0 {
		t.Fatalf("idle bindings survived: %d", n)
	}
}

func ptr[T any](v T) *T { return &v }

func TestConsistentHashStability(t *testing.T) {
	assign := func(n int) []int {
		w := make([]float64, n)
		for i := range w {
			w[i] = 1
		}
		r := testRoute(t, "consistent_hash", w, "")
		var buf [maxTargets]int
		var p Pick
		allEligible(r, &p, buf[:])
		out := make([]int, 20000)
		for k := range out {
			p.Key = []byte(fmt.Sprintf("conversation %d system prompt", k))
			out[k], _ = rank(r, &p)
		}
		return out
	}
	four, five := assign(4), assign(5)
	moved := 0
	counts := make([]int, 5)
	for k := range four {
		counts[five[k]]++
		if four[k] != five[k] {
			moved++
			if five[k] != 4 {
				t.Fatalf("key %d moved between old targets (%d -> %d)", k, four[k], five[k])
			}
		}
	}
	frac := float64(moved) / float64(len(four))
	t.Logf("adding a 5th target moved %.3f of keys; shares %v", frac, counts)
	if frac < 0.15 || frac > 0.25 {
		t.Fatalf("moved %.3f of keys, want about 1/5", frac)
	}
	for i, c := range counts {
		if c < 20000/5*7/10 || c > 20000/5*13/10 {
			t.Fatalf("target %d holds %d keys: ring too uneven %v", i, c, counts)
		}
	}
}

// TestConsistentHashBoundedLoad: one hot key under concurrency spills over instead of melting one replica.
func TestConsistentHashBoundedLoad(t *testing.T) {
	r := testRoute(t, "consistent_hash", []float64{1, 1, 1, 1}, "epsilon = 0.25")
	var buf, out [maxTargets]int
	var p Pick
	allEligible(r, &p, buf[:])
	p.Key = []byte("the one hot prompt")
	home, _ := rank(r, &p)
	for i := 1; i <= 200; i++ {
		r.rank(&p, out[:])
		r.Targets[out[0]].Provider.inflight.Add(1)
		for j, tg := range r.Targets {
			l := tg.Provider.Inflight()
			if others := float64(int64(i)-l) / 3; float64(l) > 1.25*others+2+1e-9 {
				t.Fatalf("after %d requests target %d has %d in flight, bound 1.25 x %.2f + 2", i, j, l, others)
			}
		}
	}
	// Without load the key goes home again, and session ids hash on their own.
	for _, tg := range r.Targets {
		tg.Provider.inflight.Store(0)
	}
	if got, d := rank(r, &p); got != home || d.Reason != ReasonHash {
		t.Fatalf("got %d %s, home %d", got, d.Reason, home)
	}
	// Ineligible targets are skipped.
	p.Eligible, p.EligibleMask = nil, 0
	for i := range r.Targets {
		if i != home {
			p.Eligible = append(p.Eligible, i)
			p.EligibleMask |= 1 << i
		}
	}
	if got, _ := rank(r, &p); got == home {
		t.Fatalf("ineligible home chosen")
	}
}

// randomKey returns a prompt key sharing no prefix with the others.
func randomKey(i int) []byte {
	return fmt.Appendf(nil, "%016x unrelated prompt", rand.New(rand.NewPCG(uint64(i), 3)).Uint64())
}

// TestPipelineSessionEndToEnd: through the gateway, x-session-id keeps unrelated prompts of one session on
// one replica.
func TestPipelineSessionEndToEnd(t *testing.T) {
	_, urls := simFleet(t, 3, nil)
	gw := startGateway(t, strings.ReplaceAll(gatewayConfig("pipeline", "", urls...), `model = "up-model"`, `model = "sim-model"`))
	var home string
	for i := 0; i < 12; i++ {
		resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", fmt.Sprintf("%x question %d", rand.Uint64(), i), false), "X-Session-Id", "user-7")
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, got)
		}
		target, decision := resp.Header.Get("X-Rolter-Target"), resp.Header.Get("X-Rolter-Decision")
		if i == 0 {
			home = target
			continue
		}
		if target != home || decision != "session" {
			t.Fatalf("request %d went to %s (%s), session home %s", i, target, decision, home)
		}
	}
}
