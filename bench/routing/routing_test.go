package routing

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/loadtest"
)

// TestRoutingTiny runs the routing report end to end on a tiny fleet and workload: a real
// strategy, a cache strategy, and one the gateway does not know, which must be reported as not
// available instead of failing the report.
func TestRoutingTiny(t *testing.T) {
	w := loadtest.Workload{Scenario: loadtest.SharedPrefix, Seed: 1, Groups: 4, PromptsPerGroup: 4, Popularity: loadtest.Uniform,
		SystemTokens: 48, QuestionTokens: 4, OutputTokens: 2}
	hot := loadtest.Workload{Scenario: loadtest.HotPrefix, Seed: 1, Requests: 12, SystemTokens: 48, QuestionTokens: 4, OutputTokens: 2}
	rep, err := Run(context.Background(), Options{
		Engines: 2, Scale: 16, MaxNumSeqs: 2, Concurrency: 2,
		PrefillPerToken: time.Microsecond, DecodePerToken: 100 * time.Microsecond,
		Strategies: []string{"round_robin", "cache_aware", "no_such_strategy"},
		Scenarios:  []string{loadtest.SharedPrefix, loadtest.HotPrefix},
		Workloads:  map[string]loadtest.Workload{loadtest.SharedPrefix: w, loadtest.HotPrefix: hot},
		RunTimeout: 30 * time.Second, Repeats: 2,
		LoRAWorkloads: []LoRAWorkload{{Name: "tiny", Adapters: 6, ZipfS: 1.5, PerAdapter: 4, System: 48, Question: 4, Output: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.LoRA == nil || len(rep.LoRA.Trials) != 2*len(LoRAFleets) {
		t.Fatalf("lora trials: %+v", rep.LoRA)
	}
	for _, tr := range rep.LoRA.Trials {
		if !tr.ok() || tr.Requests != 24 || tr.Loads == 0 || tr.Fewest == 0 || tr.Fewest > tr.Loads {
			t.Fatalf("lora trial %s #%d: error %q, %d requests, %d loads, fewest %d", tr.Fleet, tr.Repeat, tr.Error, tr.Requests, tr.Loads, tr.Fewest)
		}
	}
	if len(rep.Runs) != 12 {
		t.Fatalf("%d runs, want 12 (2 repeats × 2 scenarios × 3 strategies)", len(rep.Runs))
	}
	if a, b := rep.Runs[0], rep.Runs[6]; a.Seed == b.Seed || a.Scenario != b.Scenario || a.Strategy != b.Strategy {
		t.Fatalf("repeats: %s/%s seed %d then %s/%s seed %d", a.Scenario, a.Strategy, a.Seed, b.Scenario, b.Strategy, b.Seed)
	}
	for _, run := range rep.Runs {
		if run.Strategy == "no_such_strategy" {
			if !strings.Contains(run.Unavailable, "not available in this build") {
				t.Fatalf("unknown strategy: unavailable %q, error %q", run.Unavailable, run.Error)
			}
			continue
		}
		if !run.Available() {
			t.Fatalf("%s/%s did not run: %s%s", run.Scenario, run.Strategy, run.Unavailable, run.Error)
		}
		r := run.Result
		if r.Succeeded != r.Planned || r.Failed != 0 {
			t.Fatalf("%s/%s: %d of %d ok, %v", run.Scenario, run.Strategy, r.Succeeded, r.Planned, r.Errors)
		}
		if run.EngineQueried != uint64(r.PromptTokens) || run.EngineHitTokens != uint64(r.CachedTokens) {
			t.Fatalf("%s/%s: engines counted %d/%d, harness %d/%d", run.Scenario, run.Strategy,
				run.EngineHitTokens, run.EngineQueried, r.CachedTokens, r.PromptTokens)
		}
		// The gateway's delivered counters are the engines' own; a cache strategy predicts, held >= captured.
		if run.Reuse.PromptTokens != run.EngineQueried || run.Reuse.CachedTokens != run.EngineHitTokens {
			t.Fatalf("%s/%s: gateway evidence %+v, engines %d/%d", run.Scenario, run.Strategy, run.Reuse, run.EngineHitTokens, run.EngineQueried)
		}
		if run.Strategy == "cache_aware" && (run.Reuse.Scored == 0 || run.Reuse.Held < run.Reuse.Captured) {
			t.Fatalf("%s/%s: predicted reuse %+v", run.Scenario, run.Strategy, run.Reuse)
		}
		if len(run.EngineRequests) != 2 || run.Inflight.Mean == nil {
			t.Fatalf("%s/%s: engine requests %v, in flight %+v", run.Scenario, run.Strategy, run.EngineRequests, run.Inflight)
		}
	}
	dir := t.TempDir()
	files, err := Write(rep, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil || st.Size() == 0 {
			t.Fatalf("%s: %v", f, err)
		}
	}
	md, _ := os.ReadFile(filepath.Join(dir, "routing.md"))
	for _, want := range []string{"## Goals", "no_such_strategy | not available in this build", "routing-hit-rate.png", "Oracle bound"} {
		if !strings.Contains(string(md), want) {
			t.Fatalf("routing.md lacks %q:\n%s", want, md)
		}
	}
	png, _ := os.ReadFile(filepath.Join(dir, "routing-hit-rate.png"))
	if !strings.HasPrefix(string(png), "\x89PNG") {
		t.Fatalf("routing-hit-rate.png is not a PNG")
	}
}

func run(scenario, strategy string, hit, oracle, share float64) *Trial {
	return &Trial{Scenario: scenario, Strategy: strategy, Result: &loadtest.Result{
		HitRate: hit, OracleHitRate: oracle, HitVsOracle: hit / oracle, ShareMaxMin: share,
		Targets: []loadtest.TargetStat{{Name: "a", Requests: 5}, {Name: "b", Requests: 4}},
	}}
}

func TestRoutingGoals(t *testing.T) {
	f := func(runs []*Trial, want map[string]string) {
		t.Helper()
		goals := goalsOf(&Report{Runs: runs})
		got := map[string]string{}
		for _, g := range goals {
			for key := range want {
				if strings.Contains(g.Name, key) {
					got[key] = g.Verdict
				}
			}
		}
		for key, v := range want {
			if got[key] != v {
				t.Fatalf("goal %q: %q, want %q (all: %+v)", key, got[key], v, goals)
			}
		}
	}
	hotOK := &Trial{Scenario: "hot-prefix", Strategy: "cache_aware", Result: &loadtest.Result{Targets: []loadtest.TargetStat{{Requests: 3}, {Requests: 3}}},
		Inflight: fleet.InflightSummary{Mean: []float64{2, 1.6}, MaxMin: 1.25, Samples: 10}}
	f([]*Trial{
		run("shared-prefix", "round_robin", 0.2, 0.86, 1),
		run("shared-prefix", "cache_aware", 0.84, 0.86, 1.1),
		run("shared-prefix", "precise_cache_aware", 0.85, 0.86, 1.1),
		hotOK,
	}, map[string]string{"vs the oracle": "PASS", "vs round_robin": "PASS", "requests per engine": "PASS",
		"no idle engine": "PASS", "in-flight": "PASS", "(shared-prefix)": "PASS", "(multi-turn)": "n/a"})

	hotBad := &Trial{Scenario: "hot-prefix", Strategy: "cache_aware", Result: &loadtest.Result{Targets: []loadtest.TargetStat{{Requests: 6}, {Requests: 0}}},
		Inflight: fleet.InflightSummary{Mean: []float64{3, 0}, MaxMin: -1, Idle: 1, Samples: 10}}
	f([]*Trial{
		run("shared-prefix", "round_robin", 0.5, 0.86, 1),
		run("shared-prefix", "cache_aware", 0.6, 0.86, 1.4),
		{Scenario: "shared-prefix", Strategy: "precise_cache_aware", Unavailable: "not available in this build: x"},
		hotBad,
	}, map[string]string{"vs the oracle": "MISS", "vs round_robin": "MISS", "requests per engine": "MISS",
		"no idle engine": "MISS", "in-flight": "MISS", "(shared-prefix)": "n/a"})
}

// TestRunMedian: the representative run is the repeat with the median hit rate; failed repeats
// are left out, and a strategy that never ran shows why.
func TestRunMedian(t *testing.T) {
	rep := &Report{Runs: []*Trial{
		run("shared-prefix", "cache_aware", 0.7, 0.86, 1),
		run("shared-prefix", "cache_aware", 0.5, 0.86, 1),
		{Scenario: "shared-prefix", Strategy: "cache_aware", Error: "boom"},
		run("shared-prefix", "cache_aware", 0.6, 0.86, 1),
		{Scenario: "shared-prefix", Strategy: "pipeline", Unavailable: "not available in this build: x"},
		run("shared-prefix", "round_robin", 0.2, 0.86, 1),
		run("shared-prefix", "round_robin", 0.3, 0.86, 1),
	}}
	f := func(strategy string, wantHit float64, wantLo, wantHi float64, wantN int) {
		t.Helper()
		r := rep.Run("shared-prefix", strategy)
		if r == nil || r.Result == nil || r.Result.HitRate != wantHit {
			t.Fatalf("%s: representative %+v, want hit %v", strategy, r, wantHit)
		}
		lo, hi, n := rep.HitRange("shared-prefix", strategy)
		if lo != wantLo || hi != wantHi || n != wantN {
			t.Fatalf("%s: range %v..%v over %d, want %v..%v over %d", strategy, lo, hi, n, wantLo, wantHi, wantN)
		}
	}
	f("cache_aware", 0.6, 0.5, 0.7, 3)
	f("round_robin", 0.2, 0.2, 0.3, 2) // even count: the lower middle
	if r := rep.Run("shared-prefix", "pipeline"); r == nil || r.Unavailable == "" {
		t.Fatalf("pipeline: %+v", r)
	}
	if r := rep.Run("multi-turn", "pipeline"); r != nil {
		t.Fatalf("a scenario that did not run: %+v", r)
	}
}
