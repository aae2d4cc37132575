package overhead

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/config"
)

// startUpstream serves NewFakeUpstream on loopback for a test.
func startUpstream(t *testing.T, cfg fleet.UpstreamConfig) string {
	t.Helper()
	addr, stop, err := fleet.ServeFakeUpstream(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return addr
}

// TestFakeUpstreamStream: the paced stream arrives whole, each delta no earlier than its send
// stamp, the whole stream no faster than its pace; instant answers are instant JSON.
func TestFakeUpstreamStream(t *testing.T) {
	const chunks, gap = 5, 15 * time.Millisecond
	addr := startUpstream(t, fleet.UpstreamConfig{Chunks: chunks, Gap: gap})
	u := unit{c: NewCases(&Options{Strategy: "round_robin", CacheTargets: 4, PromptBytes: 8192})[0], path: PathDirect}
	r := &harness{o: &Options{ThroughputConcurrency: 2}, addrs: map[string]string{u.key(): addr}, chunks: chunks,
		clients: map[string]*fasthttp.HostClient{u.key(): {Addr: addr}}}
	start := time.Now()
	st, err := r.stream(context.Background(), u, streamBody, chunks)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if took < chunks*gap {
		t.Fatalf("stream took %v, faster than its pace %v", took, chunks*gap)
	}
	if len(st.gaps) != chunks-1 || len(st.transit) != chunks {
		t.Fatalf("%d gaps, %d transits; want %d, %d", len(st.gaps), len(st.transit), chunks-1, chunks)
	}
	sum := 0.0
	for _, g := range st.gaps {
		sum += g
	}
	for _, tr := range st.transit {
		if tr < 0 {
			t.Fatalf("a delta arrived before it was sent: transit %v µs", tr)
		}
	}
	// The role chunk comes at once, before the paced deltas: its first byte is measured, and before the
	// stream ended. (Not against the pace itself: on a loaded machine the first byte can be late by more
	// than the gaps.)
	if st.ttfb <= 0 || st.ttfb >= float64(took.Microseconds()) {
		t.Fatalf("ttfb %v µs of a %v stream (gaps sum %v µs)", st.ttfb, took, sum)
	}

	// "max_tokens": 1 asks for a stream of one delta.
	if one, err := r.stream(context.Background(), u, firstByteBody, 1); err != nil || len(one.transit) != 1 {
		t.Fatalf("one-delta stream: %d deltas, %v", len(one.transit), err)
	}

	var seq atomic.Uint64
	l, err := r.latency(context.Background(), u, 20, &seq)
	if err != nil || len(l.samples) != 20 || l.errors != 0 || seq.Load() != 20 {
		t.Fatalf("latency: %v, %d samples, %d errors, %d bodies", err, len(l.samples), l.errors, seq.Load())
	}
	tp := r.throughput(context.Background(), u, 2, 100*time.Millisecond, &seq)
	if tp.count == 0 || tp.errors != 0 || tp.gatewayCPU != 0 {
		t.Fatalf("throughput: %+v", tp)
	}
}

// TestPromptBodies: the cache_aware case's bodies are chat completions whose user message has the
// configured size, the same for a number, and different from every other number's within 20 bytes.
func TestPromptBodies(t *testing.T) {
	g := newPromptBodies("m", 8192)
	content := func(seq uint64) string {
		t.Helper()
		var v struct {
			Model    string `json:"model"`
			Messages []struct {
				Role, Content string
			} `json:"messages"`
		}
		if err := json.Unmarshal(g.appendBody(nil, seq), &v); err != nil || v.Model != "m" || len(v.Messages) != 1 || v.Messages[0].Role != "user" {
			t.Fatalf("body %d: %v %+v", seq, err, v)
		}
		return v.Messages[0].Content
	}
	f := func(a, b uint64) {
		t.Helper()
		ca, cb := content(a), content(b)
		if len(ca) != 8192 || len(cb) != 8192 {
			t.Fatalf("message sizes %d, %d; want 8192", len(ca), len(cb))
		}
		if a == b {
			if ca != cb {
				t.Fatalf("body %d rendered twice differs", a)
			}
			return
		}
		if ca[:20] == cb[:20] {
			t.Fatalf("bodies %d and %d share their first 20 bytes: %q", a, b, ca[:20])
		}
		if ca[promptHeadLen:promptHeadLen+64] == cb[promptHeadLen:promptHeadLen+64] {
			t.Fatalf("bodies %d and %d have the same text", a, b)
		}
	}
	f(0, 0)
	f(0, 1)
	f(1, seqPhase+1)
	f(seqPhase, 2*seqPhase)
	f(7*seqPhase+12345, 7*seqPhase+12346)
	f(999_999_999_999, 999_999_999_999)
	// A body is rendered into the buffer it is given.
	buf := g.appendBody(nil, 1)
	if got := g.appendBody(buf[:0], 2); &got[0] != &buf[0] {
		t.Fatal("appendBody did not reuse its buffer")
	}
}

// TestOverheadConfigs: the generated Rolter configs pass the gateway's own validation with the route and
// targets of their case.
func TestOverheadConfigs(t *testing.T) {
	cases := NewCases(&Options{Strategy: "round_robin", CacheTargets: 4, PromptBytes: 8192})
	for _, c := range cases {
		for _, mem := range []int{0, 1 << 20} {
			text := RolterConfig(c, "127.0.0.1:18080", "127.0.0.1:18081", mem)
			cfg, err := config.Parse([]byte(text), c.Name+".toml")
			if err != nil {
				t.Fatalf("%s config:\n%s\n%s", c.Name, text, err)
			}
			if len(cfg.Routes) != 1 || cfg.Routes[0].Model != c.Model || cfg.Routes[0].Strategy != c.Strategy ||
				len(cfg.Routes[0].Targets) != c.Targets || len(cfg.Providers) != c.Targets {
				t.Fatalf("%s config: routes %+v, %d providers", c.Name, cfg.Routes, len(cfg.Providers))
			}
			want := mem
			if mem == 0 {
				want = config.Default().Server.RoutingMemoryBytes
			}
			if cfg.Server.RoutingMemoryBytes != want {
				t.Fatalf("%s config: routing memory %d, want %d", c.Name, cfg.Server.RoutingMemoryBytes, want)
			}
		}
	}
}

func TestParseTrieMetrics(t *testing.T) {
	body := []byte(`# TYPE rolter_trie_prompts gauge
rolter_trie_prompts{route="fake-cache",target="upstream-1"} 10
rolter_trie_prompts{route="fake-cache",target="upstream-2"} 12
rolter_trie_prompts{route="other",target="x"} 1000
rolter_trie_nodes{route="fake-cache",target="upstream-1"} 30
rolter_trie_edge_bytes{route="fake-cache",target="upstream-1"} 2097152
rolter_trie_arena_bytes{route="fake-cache",target="upstream-1"} 1048576
rolter_trie_evictions_total{route="fake-cache",target="upstream-1"} 5
rolter_trie_evictions_total{route="fake-cache",target="upstream-2"} 6
rolter_decisions_total{route="fake-cache",strategy="cache_aware",decision="no_match"} 40
rolter_decisions_total{route="fake-cache",strategy="cache_aware",decision="prefix_hit"} 2
rolter_decisions_total{route="other",strategy="round_robin",decision="round_robin"} 99
rolter_requests_total{route="fake-cache"} 42
`)
	got := parseTrieMetrics(body, "fake-cache")
	want := TrieSnapshot{Prompts: 22, Nodes: 30, EdgeMiB: 2, ArenaMiB: 1, Evictions: 11,
		Decisions: map[string]float64{"no_match": 40, "prefix_hit": 2}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// TestOverheadTiny runs the whole report on a tiny budget: an in-process upstream, this test binary as
// `rolter serve` (TestMain), HAProxy when installed. Both cases are measured on every path, the cache_aware
// Rolter's tries evict before the rounds and during them, no gateway is sent a prompt twice, and the report
// has both cases' goals.
func TestOverheadTiny(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	addr, seen := countingUpstream(t)
	var log strings.Builder
	rep, err := Run(context.Background(), Options{
		Rolter: self, RefProxy: buildRefProxy(t), Rounds: 2, LatencyRequests: 20, ThroughputConcurrency: 4, ThroughputDuration: 100 * time.Millisecond,
		Streams: 1, FirstByteStreams: 2, SustainDuration: 300 * time.Millisecond, FillTimeout: 5 * time.Second, Log: &log,
		UpstreamAddr: addr, streamChunks: 4, streamGap: 5 * time.Millisecond, RoutingMemory: 1 << 20,
		settle: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("%s\n%s", err, log.String())
	}
	if len(rep.Cases) != 2 || rep.Case(CaseSmall) == nil || rep.Case(CaseCache) == nil {
		t.Fatalf("cases %+v", rep.Cases)
	}
	for _, c := range rep.Cases {
		checkTinyCase(t, rep, c, log.String())
	}
	checkTinyTries(t, rep.Case(CaseCache))
	for n, k := range seen() {
		if k > len(rep.Paths) {
			t.Fatalf("prompt %s reached the upstream %d times over %d paths", n, k, len(rep.Paths))
		}
	}
	checkTinyReport(t, rep)
}

// countingUpstream starts an in-process fake upstream that counts every prompt number it is sent; seen
// returns a copy of the counts.
func countingUpstream(t *testing.T) (addr string, seen func() map[string]int) {
	t.Helper()
	var mu sync.Mutex
	counts := map[string]int{}
	h := fleet.NewFakeUpstream(fleet.UpstreamConfig{Chunks: 4, Gap: 5 * time.Millisecond})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{CloseOnShutdown: true, Handler: func(ctx *fasthttp.RequestCtx) {
		if _, rest, ok := bytes.Cut(ctx.PostBody(), []byte(`"content":"request `)); ok && len(rest) >= 12 {
			mu.Lock()
			counts[string(rest[:12])]++
			mu.Unlock()
		}
		h(ctx)
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String(), func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(counts)
	}
}

// buildRefProxy builds bench/cmd/refproxy into the test's directory and returns the binary.
func buildRefProxy(t *testing.T) string {
	t.Helper()
	refproxy := filepath.Join(t.TempDir(), "refproxy")
	if out, err := exec.Command("go", "build", "-o", refproxy, "../cmd/refproxy").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/refproxy: %v\n%s", err, out)
	}
	return refproxy
}

// checkTinyCase: case c was measured on every path without errors, streams where it has them, and a
// sustained run for each gateway.
func checkTinyCase(t *testing.T, rep *Report, c *Case, log string) {
	t.Helper()
	if len(c.Rounds) != 2 {
		t.Fatalf("%s: %d rounds", c.Name, len(c.Rounds))
	}
	for _, p := range rep.Paths {
		s := c.Summary[p]
		if s == nil || s.Throughput <= 0 || s.LatencyP50 <= 0 || s.SparseP50 <= 0 || s.Errors != 0 {
			t.Fatalf("%s %s: %+v\n%s", c.Name, p, s, log)
		}
		if p != PathDirect && s.GatewaySwitches <= 0 {
			t.Fatalf("%s %s: %v context switches per request", c.Name, p, s.GatewaySwitches)
		}
		if streams := c.Streams && !isYardstick(p); streams != (s.TTFB > 0) {
			t.Fatalf("%s %s: streams %v, ttfb %v", c.Name, p, streams, s.TTFB)
		}
	}
	// A sustained run for each gateway: Rolter, and HAProxy where installed; not the yardsticks.
	if want := len(rep.Paths) - 1 - len(yardsticks); len(c.RSS) != want {
		t.Fatalf("%s: %d sustained runs, want %d", c.Name, len(c.RSS), want)
	}
}

// checkTinyTries: the cache_aware case's tries evicted before the rounds and during them, its prompts
// were new to them, and its bodies are as large as configured.
func checkTinyTries(t *testing.T, cache *Case) {
	t.Helper()
	ts := cache.Tries
	if ts == nil || !ts.Filled || ts.AfterRounds.Evictions <= ts.AfterFill.Evictions {
		t.Fatalf("tries %+v", ts)
	}
	// Every prompt is new: decided as one (home, or no_match and the like when the home is busy), not as a
	// prefix hit.
	total, hits := 0.0, ts.AfterRounds.Decisions["prefix_hit"]
	for _, n := range ts.AfterRounds.Decisions {
		total += n
	}
	if total == 0 || hits*10 > total {
		t.Fatalf("cache case decisions %v: want new prompts", ts.AfterRounds.Decisions)
	}
	if cache.BodyNanos <= 0 || cache.BodyBytes < 8192 {
		t.Fatalf("cache case bodies: %v ns, %d bytes", cache.BodyNanos, cache.BodyBytes)
	}
}

// checkTinyReport: the report has the cache_aware case's goals, every yardstick, and both cases' sections.
func checkTinyReport(t *testing.T, rep *Report) {
	t.Helper()
	cache := rep.Case(CaseCache)
	goals := 0
	for _, g := range rep.Goals {
		if strings.HasPrefix(g.Name, cache.Label()+": ") {
			goals++
		}
	}
	if goals != 3 { // added p50, throughput, RSS
		t.Fatalf("%d goals of the cache_aware case: %+v", goals, rep.Goals)
	}
	md := rep.Markdown()
	for _, y := range yardsticks {
		if !slices.Contains(rep.Paths, y.path) {
			t.Fatalf("paths %v lack the yardstick %s", rep.Paths, y.path)
		}
	}
	for _, s := range []string{"## Results: " + cache.Label(), "## Results: " + rep.Case(CaseSmall).Label(), "Evictions during the rounds",
		"| null-fasthttp |", "| null-net |", "| null-lean |", "null-net ÷ haproxy", "null-lean ÷ haproxy"} {
		if !strings.Contains(md, s) {
			t.Fatalf("markdown lacks %q:\n%s", s, md)
		}
	}
}

func TestDeltaStamp(t *testing.T) {
	f := func(ev string, want int64, wantOK bool) {
		t.Helper()
		got, ok := deltaStamp([]byte(ev))
		if got != want || ok != wantOK {
			t.Fatalf("%q: got %d %v, want %d %v", ev, got, ok, want, wantOK)
		}
	}
	f(`data: {"choices":[{"delta":{"content":"1700000000123456789"}}]}`, 1700000000123456789, true)
	f(string(fleet.RoleEvent), 0, false)
	f(string(fleet.FinishEvent), 0, false)
	f(`data: {"choices":[{"delta":{"content":"abc"}}]}`, 0, false)
}

func TestRSSTrend(t *testing.T) {
	f := func(samples []float64, wantGrowth float64, wantFlat bool) {
		t.Helper()
		_, _, _, g, flat := rssTrend(samples)
		if g != wantGrowth || flat != wantFlat {
			t.Fatalf("%v: growth %v flat %v; want %v %v", samples, g, flat, wantGrowth, wantFlat)
		}
	}
	f([]float64{10, 20, 30, 30, 30, 30, 31, 30, 30}, 0, true)           // warm-up, then a plateau
	f([]float64{20, 20, 20, 30, 31, 32, 40, 42, 44}, 11, false)         // still growing
	f([]float64{100, 100, 100, 100, 100, 104, 104, 104, 104}, 4, true)  // 4 MiB < 5% of 100
	f([]float64{100, 100, 100, 100, 100, 100, 106, 106, 106}, 6, false) // 6 MiB > 5 MiB
	f([]float64{1, 2}, 0, false)
}

func TestOverheadSummaryAndGoals(t *testing.T) {
	round := func(d, r, h float64, tput [3]float64) map[string]*PathRound {
		mk := func(lat, tput float64, gapJit float64) *PathRound {
			return &PathRound{LatencyP50: lat, LatencyP99: 2 * lat, Throughput: tput, TTFB: lat,
				Gaps: []float64{20000, 20000 + gapJit}, Transit: []float64{100, 100 + gapJit}, Jitter: []float64{gapJit}}
		}
		return map[string]*PathRound{PathDirect: mk(d, tput[0], 5), PathRolter: mk(r, tput[1], 20), PathHAProxy: mk(h, tput[2], 10)}
	}
	paths := []string{PathDirect, PathRolter, PathHAProxy}
	cases := NewCases(&Options{Strategy: "round_robin", CacheTargets: 4, PromptBytes: 8192})
	small, cache := cases[0], cases[1]
	ok, slow := [3]float64{50000, 30000, 33000}, [3]float64{40000, 20000, 30000}
	small.Rounds = []map[string]*PathRound{round(30, 90, 80, ok), round(30, 95, 85, ok), round(40, 100, 1000, ok)}
	// The cache_aware case: added p50 100 vs 50 µs (2x), throughput 20000 vs 30000 (0.67x).
	cache.Rounds = []map[string]*PathRound{round(50, 150, 100, slow), round(50, 150, 100, slow)}
	rep := &Report{Paths: paths, Cases: cases}
	rep.Options.ThroughputConcurrency = 64
	for _, c := range cases {
		summarize(c, paths)
	}
	ro, hp := small.Summary[PathRolter], small.Summary[PathHAProxy]
	// Added = median over rounds of (path - direct): rolter 60, 65, 60 -> 60; haproxy 50, 55, 960 -> 55.
	if ro.AddedP50 != 60 || hp.AddedP50 != 55 || ro.Throughput != 30000 || ro.AddedJitP99 != 15 {
		t.Fatalf("rolter %+v haproxy %+v", ro, hp)
	}
	small.RSS = []*RSSRun{{Path: PathRolter, Flat: true}, {Path: PathHAProxy, Flat: true}}
	cache.RSS = []*RSSRun{{Path: PathRolter, GrowthMiB: 40}}
	f := func(goals []fleet.Goal, want ...string) {
		t.Helper()
		if len(goals) != len(want) {
			t.Fatalf("%d goals, want %d: %+v", len(goals), len(want), goals)
		}
		for i, g := range goals {
			if g.Verdict != want[i] {
				t.Fatalf("goal %q: %s (%s), want %s", g.Name, g.Verdict, g.Measured, want[i])
			}
		}
	}
	// small: p50 60/55 = 1.09, p99 120/110, throughput 0.91, stream first byte 60/55 (it is the latency here);
	// cache: p50 2x, throughput 0.67; gap +15 µs; RSS flat (small), +40 MiB (cache).
	goals := goalsOf(rep)
	f(goals, "PASS", "PASS", "PASS", "PASS", "MISS", "MISS", "PASS", "PASS", "MISS")
	if !strings.Contains(goals[3].Name, "stream time to first byte") || !strings.Contains(goals[3].Measured, "1.09x") {
		t.Fatalf("stream goal: %+v", goals[3])
	}
	if !strings.HasPrefix(goals[4].Name, cache.Label()+": added latency") || !strings.Contains(goals[5].Measured, "0.67x") {
		t.Fatalf("cache_aware goals: %+v", goals[4:6])
	}
	md := rep.Markdown()
	for _, s := range []string{"## Goals", "rolter ÷ haproxy", "1.09x", "## Results: " + cache.Label(), "stream time to first byte"} {
		if !strings.Contains(md, s) {
			t.Fatalf("markdown lacks %q:\n%s", s, md)
		}
	}
	if strings.Count(md, "| stream time to first byte") != 1 {
		t.Fatal("stream rows outside the small-body case")
	}
	// Without HAProxy the ratio goals are n/a, not failures.
	for _, c := range cases {
		delete(c.Summary, PathHAProxy)
	}
	for _, g := range goalsOf(rep)[:6] {
		if g.Verdict != "n/a" {
			t.Fatalf("goal %q without HAProxy: %s", g.Name, g.Verdict)
		}
	}
}

// TestProcSwitches: the context switches of a process grow as its threads sleep and wake.
func TestProcSwitches(t *testing.T) {
	n0, ok := procSwitches(os.Getpid())
	if !ok {
		t.Skip("no /proc")
	}
	for i := 0; i < 5; i++ {
		time.Sleep(2 * time.Millisecond)
	}
	n1, ok := procSwitches(os.Getpid())
	if !ok || n1 < n0+5 {
		t.Fatalf("switches %d -> %d (%v) across 5 sleeps", n0, n1, ok)
	}
	if _, ok := procSwitches(0); ok {
		t.Fatal("pid 0 measured")
	}
}
