package ab

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/bench/overhead"
)

// TestABTiny runs the A/B comparison end to end with the test binary as both builds, in both cases: every
// run serves requests without errors and the report names both builds.
func TestABTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("starts gateways")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	up := startUpstream(t, fleet.UpstreamConfig{})
	for _, c := range []string{overhead.CaseSmall, overhead.CaseCache} {
		rep, err := Run(context.Background(), Options{A: self, B: self, Case: c, Rounds: 2, Warmup: 100 * time.Millisecond,
			Duration: 300 * time.Millisecond, upstreamAddr: up, routingMemory: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Rounds) != 2 {
			t.Fatalf("%s: %d rounds", c, len(rep.Rounds))
		}
		for i, p := range rep.Rounds {
			for k, r := range p {
				if r.RPS <= 0 || r.Errors != 0 {
					t.Fatalf("%s: round %d, build %d: %+v", c, i+1, k, r)
				}
			}
		}
		if md := rep.Markdown(); !strings.Contains(md, "B ÷ A") || !strings.Contains(md, "| 2 |") {
			t.Fatalf("%s: report:\n%s", c, md)
		}
	}
	// B on another strategy: the cache case's requests through round_robin, without the tries' fill; a
	// strategy that does not exist stops B's gateway from starting, so the option reaches B's config.
	o := Options{A: self, B: self, Case: overhead.CaseCache, StrategyB: "round_robin", Rounds: 1, Warmup: 100 * time.Millisecond,
		Duration: 300 * time.Millisecond, upstreamAddr: up, routingMemory: 1 << 20}
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if r := rep.Rounds[0][1]; r.RPS <= 0 || r.Errors != 0 {
		t.Fatalf("strategy B: %+v", r)
	}
	if md := rep.Markdown(); !strings.Contains(md, "strategy round_robin") {
		t.Fatalf("strategy B: report:\n%s", md)
	}
	o.StrategyB = "no_such_strategy"
	if _, err := Run(context.Background(), o); err == nil {
		t.Fatal("B on a strategy that does not exist: no error")
	}
}

// TestABMedians: each build's median is its middle round, or the mean of the two middle ones, figure by
// figure; errors add up.
func TestABMedians(t *testing.T) {
	r := func(rps, cpu float64, errs int) Result {
		return Result{RPS: rps, GatewayCPU: cpu, MachineCPUs: 1, Errors: errs}
	}
	odd := [][2]Result{{r(10, 50, 0), r(20, 40, 1)}, {r(30, 70, 0), r(10, 60, 0)}, {r(20, 60, 2), r(30, 50, 0)}}
	if m := medians(odd); m[0].RPS != 20 || m[0].GatewayCPU != 60 || m[1].RPS != 20 || m[1].GatewayCPU != 50 || m[0].Errors != 2 || m[1].Errors != 1 {
		t.Fatalf("odd rounds: %+v", m)
	}
	even := append(odd, [2]Result{r(40, 80, 0), r(40, 30, 0)})
	if m := medians(even); m[0].RPS != 25 || m[0].GatewayCPU != 65 || m[1].RPS != 25 || m[1].GatewayCPU != 45 {
		t.Fatalf("even rounds: %+v", m)
	}
}
