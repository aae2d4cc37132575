package pressure

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/loadtest"
)

// TestPressureQuick runs the -quick report end to end - every workload, capacity and strategy on 4 engines -
// and checks what cannot depend on timing: every cell present and measured, rates in [0, 1], the engines'
// counters agreeing with the client's, the references ordered as their definitions force, the report
// rendering and reloading.
func TestPressureQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 126 small fleets")
	}
	rep, err := Run(context.Background(), Options{Quick: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := len(WorkloadNames) * len(Capacities) * len(Strategies); len(rep.Cells) != want {
		t.Fatalf("%d cells, want %d", len(rep.Cells), want)
	}
	for _, w := range WorkloadNames {
		info := rep.Info(w)
		if info == nil || len(info.Levels) != len(Capacities) || info.Plan.Blocks == 0 {
			t.Fatalf("%s: workload info %+v", w, info)
		}
		for _, lv := range info.Levels {
			if lv.NumBlocks < info.Plan.MaxRequestBlocks || lv.PlacementHitRate > info.Plan.OracleHitRate+1e-9 ||
				lv.RoundRobinHitRate > info.Plan.OracleHitRate+1e-9 {
				t.Fatalf("%s: level %+v, plan %+v", w, lv, info.Plan)
			}
		}
		for _, capacity := range Capacities {
			for _, s := range Strategies {
				checkCell(t, rep.Cell(w, capacity, s), w, capacity, s)
			}
		}
	}
	if len(rep.Goals) != 14 {
		t.Fatalf("%d goals: %+v", len(rep.Goals), rep.Goals)
	}
	dir := t.TempDir()
	if _, err := Write(rep, dir, ""); err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "pressure.md"))
	for _, want := range []string{"## Goals", "## What the numbers say", "## " + MultiTurn, "placement reference", "burst: idle"} {
		if !strings.Contains(string(md), want) {
			t.Fatalf("pressure.md lacks %q:\n%s", want, md)
		}
	}
	again, err := Load(filepath.Join(dir, "pressure.json"))
	if err != nil {
		t.Fatal(err)
	}
	if again.Markdown() != rep.Markdown() {
		t.Fatalf("the report rendered from JSON differs")
	}
}

// checkCell checks one cell of TestPressureQuick: measured (precise_cache_aware may be unavailable
// without cgo), every request answered, rates in [0, 1], the engines' counters agreeing with the client's,
// the bounds holding.
func checkCell(t *testing.T, c *Cell, w string, capacity float64, s string) {
	t.Helper()
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	in01 := func(v float64) bool { return v >= 0 && v <= 1 }
	switch {
	case c == nil:
		t.Fatalf("%s %v %s: missing", w, capacity, s)
	case c.Unavailable != "" && s == "precise_cache_aware":
		return // a build without cgo
	case !c.Available():
		t.Fatalf("%s %v %s: not measured: %s%s", w, capacity, s, c.Unavailable, c.Error)
	}
	if c.Succeeded != c.Planned || c.Failed+c.Cancelled != 0 {
		t.Fatalf("%s %v %s: %d of %d answered, %d failed, %d cancelled", w, capacity, s, c.Succeeded, c.Planned, c.Failed, c.Cancelled)
	}
	if !in01(c.HitRate) || !in01(c.OracleHitRate) || !in01(c.PlacementHitRate) || !in01(c.PooledHitRate) {
		t.Fatalf("%s %v %s: rates %+v", w, capacity, s, c)
	}
	// The engines count what the responses report.
	if c.EnginePromptTokens == 0 || !near(c.HitRate, float64(c.EngineCachedTokens)/float64(c.EnginePromptTokens)) {
		t.Fatalf("%s %v %s: hit %v, engines %d/%d", w, capacity, s, c.HitRate, c.EngineCachedTokens, c.EnginePromptTokens)
	}
	// A capacity-aware placement hits only what an earlier request computed. A live fleet can beat
	// the unlimited bound only by reordering requests whose shared blocks the bound counts anyway
	// (every prompt here ends in its own question), so within a token or two per request.
	if c.PlacementHitRate > c.OracleHitRate+1e-9 || c.HitRate > c.OracleHitRate+0.01 {
		t.Fatalf("%s %v %s: hit %v, placement %v above the unlimited bound %v", w, capacity, s, c.HitRate, c.PlacementHitRate, c.OracleHitRate)
	}
	if len(c.Load.Requests) != 4 || sum(c.Load.Requests) != c.Succeeded || len(c.Evictions) != 4 {
		t.Fatalf("%s %v %s: load %+v, evictions %v", w, capacity, s, c.Load, c.Evictions)
	}
	if (w == HotBurst) != (c.Burst != nil) {
		t.Fatalf("%s %v %s: burst %+v", w, capacity, s, c.Burst)
	}
}

func TestPlacementOracle(t *testing.T) {
	// Prompts of whole blocks (B = 2): a prompt's blocks are its tokens in pairs.
	f := func(engines, capacity int, epsilon float64, prompts [][]uint32, wantEngines []int, wantHits []int) {
		t.Helper()
		o := NewPlacementOracle(engines, capacity, 2, epsilon)
		for i, p := range prompts {
			e, hit := o.Add(p)
			if e != wantEngines[i] || hit != wantHits[i] {
				t.Fatalf("prompt %d %v: engine %d hit %d, want %d and %d", i, p, e, hit, wantEngines[i], wantHits[i])
			}
		}
	}
	a, b := []uint32{1, 2, 3, 4, 9}, []uint32{1, 2, 3, 4, 8}
	// One engine: the second prompt hits the two shared blocks.
	f(1, 10, 0.25, [][]uint32{a, b}, []int{0, 0}, []int{0, 4})
	// At most ⌊(L−1)/B⌋ blocks: a prompt equal to a cached one still computes its last token.
	f(1, 10, 0.25, [][]uint32{{1, 2, 3, 4}, {1, 2, 3, 4}}, []int{0, 0}, []int{0, 2})
	// Two engines, no cap in the way: the holder wins; a new prompt goes to the engine with fewer requests.
	f(2, 10, 1, [][]uint32{a, b, {7, 7, 7}}, []int{0, 0, 1}, []int{0, 4, 0})
	// The bounded load: with epsilon 0 the second request may not join the first engine.
	f(2, 10, 0, [][]uint32{a, b}, []int{0, 1}, []int{0, 0})
	// Capacity 2 blocks: a prompt of 2 full blocks evicts the older prompt's blocks.
	f(1, 2, 0.25, [][]uint32{a, {5, 6, 7, 8, 1}, b}, []int{0, 0, 0}, []int{0, 0, 0})
}

func TestBlockLRU(t *testing.T) {
	c := newBlockLRU(3)
	c.touch([]uint64{1, 2}) // recency: 1 2
	c.touch([]uint64{3, 4}) // 3 4 1 2 → evicts 2
	if c.match([]uint64{1}) != 1 || c.match([]uint64{2}) != 0 || c.match([]uint64{3, 4}) != 2 {
		t.Fatalf("after two prompts: %v", c.index)
	}
	c.touch([]uint64{1, 5}) // 1 5 3 4 → evicts 4: a sequence's tail goes before its head
	if c.match([]uint64{3, 4}) != 1 || c.match([]uint64{1, 5}) != 2 || len(c.nodes) > 5 {
		t.Fatalf("after three prompts: %v (%d nodes)", c.index, len(c.nodes))
	}
}

func TestParseStrategySpec(t *testing.T) {
	f := func(in, wantStrategy, wantParams string, wantErr bool) {
		t.Helper()
		s, err := ParseStrategySpec(in)
		if (err != nil) != wantErr {
			t.Fatalf("%q: error %v", in, err)
		}
		if err != nil {
			return
		}
		if s.Strategy != wantStrategy || s.Label != in || s.routeParams(100, 16) != wantParams {
			t.Fatalf("%q: %+v, params %q", in, s, s.routeParams(100, 16))
		}
	}
	f("cache_aware", "cache_aware", "", false)
	f("cache_aware:max_trie_bytes=0.5kv,threshold=0.3", "cache_aware",
		"\n[routes.params]\nmax_trie_bytes = 3200\nthreshold = 0.3\n", false)
	f("pipeline:home=true", "pipeline", "\n[routes.params]\nhome = true\n", false)
	f(":x=1", "", "", true)
	f("cache_aware:threshold", "", "", true)
	f("cache_aware:threshold=abc", "", "", true)
	f("cache_aware:max_trie_bytes=-1kv", "", "", true)
}

// TestPressurePlans checks the workloads' construction: the same seed gives the same plan, every multi-turn
// turn extends its conversation's previous one and waits for it, and the hot prefix appears only in the
// burst window.
func TestPressurePlans(t *testing.T) {
	for _, name := range WorkloadNames {
		w := DefaultWorkload(name, true, 7)
		p1, err := w.Plan()
		if err != nil {
			t.Fatal(err)
		}
		p2, _ := w.Plan()
		if len(p1.Requests) == 0 || len(p1.Requests) != len(p2.Requests) {
			t.Fatalf("%s: %d and %d requests", name, len(p1.Requests), len(p2.Requests))
		}
		for i := range p1.Requests {
			if requestKey(p1.Requests[i]) != requestKey(p2.Requests[i]) {
				t.Fatalf("%s: request %d differs between two plans of one seed", name, i)
			}
		}
	}
	w := DefaultWorkload(MultiTurn, true, 1)
	p, _ := w.Plan()
	last := map[int]int{}
	turns := 0
	for i, r := range p.Requests {
		prev, ok := last[r.Group]
		if !ok {
			if r.After != 0 || len(r.Messages) != 2 {
				t.Fatalf("request %d opens conversation %d after %d with %d messages", i, r.Group, r.After, len(r.Messages))
			}
		} else {
			pt, ct := appendTokens(nil, p.Requests[prev].Messages), appendTokens(nil, r.Messages)
			if r.After != prev+1 || len(ct) <= len(pt) || !slices.Equal(ct[:len(pt)], pt) {
				t.Fatalf("request %d (conversation %d) does not extend request %d (after %d)", i, r.Group, prev, r.After)
			}
			turns++
		}
		last[r.Group] = i
	}
	if len(last) != w.Conversations || turns == 0 {
		t.Fatalf("%d conversations, %d later turns", len(last), turns)
	}
	w = DefaultWorkload(HotBurst, true, 1)
	p, _ = w.Plan()
	lo, hi := int(w.BurstStart*float64(w.Requests)), int(w.BurstEnd*float64(w.Requests))
	hot := 0
	for i, r := range p.Requests {
		if r.Group == w.hotGroup() {
			hot++
			if i < lo || i >= hi {
				t.Fatalf("hot request %d outside the burst [%d, %d)", i, lo, hi)
			}
		}
	}
	if hot < (hi-lo)/2 {
		t.Fatalf("%d hot requests in a burst of %d", hot, hi-lo)
	}
}

func requestKey(r loadtest.Request) string {
	var b strings.Builder
	for _, m := range r.Messages {
		b.WriteString(m.Role + ":" + m.Content + "|")
	}
	return b.String()
}

func TestLoadSpread(t *testing.T) {
	f := func(targets []string, wantReq []int, wantMaxMin float64, wantIdle int) {
		t.Helper()
		var samples []loadtest.Sample
		for _, tg := range targets {
			samples = append(samples, loadtest.Sample{Target: tg, PromptTokens: 10, CachedTokens: 4})
		}
		samples = append(samples, loadtest.Sample{Target: "a", Error: "boom"})
		s := loadSpread(samples, []string{"a", "b", "c"})
		if !slices.Equal(s.Requests, wantReq) || s.BusiestIdlest != wantMaxMin || s.Idle != wantIdle || s.Prefill[0] != int64(6*wantReq[0]) {
			t.Fatalf("%v: %+v", targets, s)
		}
	}
	f([]string{"a", "b", "c"}, []int{1, 1, 1}, 1, 0)
	f([]string{"a", "a", "b", "c"}, []int{2, 1, 1}, 2, 0)
	f([]string{"a", "b", "b"}, []int{1, 2, 0}, -1, 1)
}
