package ab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/bench/overhead"
)

// Options configure an A/B run (bench/cmd/ab): two `rolter serve` builds measured in turn in one of the
// overhead report's cases, at its c=64 closed loop, each round starting each build afresh.
type Options struct {
	// A and B are the two rolter binaries; Upstream the fake upstream binary.
	A, B, Upstream string
	// Case is the overhead report's case: overhead.CaseSmall or overhead.CaseCache.
	Case string
	// StrategyB, when set, is the routing strategy B's route uses instead of the case's (A keeps the case's):
	// with B the same binary as A, what a strategy costs over another on the same requests and targets,
	// e.g. the cache_aware case's tries against round_robin over its 4 targets.
	StrategyB string
	// Rounds (6) of one run of each build, in alternating order: A then B, then B then A.
	Rounds int
	// Warmup (1s) before, and Duration (4s) of, the measured closed loop of each run.
	Warmup, Duration time.Duration
	// Log receives progress lines; nil discards them.
	Log io.Writer

	// Test hooks: an upstream already listening (Upstream is then not started), and the cache case's
	// routing_memory_bytes (0: the gateway's default).
	upstreamAddr  string
	routingMemory int
}

// Result is one build's measurement in one round.
type Result struct {
	RPS         float64
	GatewayCPU  float64 // µs per request; -1: unknown
	MachineCPUs float64 // -1: unknown
	Errors      int
}

// Report is the result of Run: per round the runs of A and B, and their medians.
type Report struct {
	Case string
	A, B string
	// StrategyB is Options.StrategyB: B's strategy when it is not the case's.
	StrategyB string
	Rounds    [][2]Result
	Median    [2]Result
}

// Run measures builds A and B in turn; every process it starts is stopped before it returns.
func Run(ctx context.Context, o Options) (*Report, error) {
	fleet.OrDefault(&o.Rounds, 6)
	fleet.OrDefault(&o.Warmup, time.Second)
	fleet.OrDefault(&o.Duration, 4*time.Second)
	fleet.OrDefault(&o.Case, overhead.CaseSmall)
	fleet.OrDefault(&o.Log, io.Discard)
	if o.A == "" || o.B == "" || (o.Upstream == "" && o.upstreamAddr == "") {
		return nil, errors.New("cannot run the A/B comparison: need both rolter binaries (-a, -b) and the fake upstream (-upstream)")
	}
	if o.Case != overhead.CaseSmall && o.Case != overhead.CaseCache {
		return nil, fmt.Errorf("cannot run the A/B comparison: case %q is not %s or %s", o.Case, overhead.CaseSmall, overhead.CaseCache)
	}
	oo := overhead.Options{Rolter: o.A, Upstream: o.Upstream, UpstreamAddr: o.upstreamAddr, RoutingMemory: o.routingMemory,
		ThroughputDuration: o.Duration, Log: o.Log}
	if err := oo.Normalize(); err != nil {
		return nil, err
	}
	oo.HAProxy = "" // Rolter only
	if oo.UpstreamAddr == "" {
		up, addr, err := fleet.StartProc("fake upstream", oo.Upstream, []string{"-listen", "127.0.0.1:0"}, "listening http://", 10*time.Second)
		if err != nil {
			return nil, err
		}
		defer up.Stop()
		oo.UpstreamAddr = addr
	}
	rep := &Report{Case: o.Case, A: o.A, B: o.B, StrategyB: o.StrategyB}
	var seq atomic.Uint64
	for round := range o.Rounds {
		var pair [2]Result
		order := []int{0, 1}
		if round%2 == 1 {
			order = []int{1, 0}
		}
		for _, k := range order {
			bin, strategy := o.A, ""
			if k == 1 {
				bin, strategy = o.B, o.StrategyB
			}
			run, err := measure(ctx, oo, bin, o.Case, strategy, o.Warmup, &seq)
			if err != nil {
				return nil, fmt.Errorf("round %d, %s: %w", round+1, bin, err)
			}
			pair[k] = run
			fmt.Fprintf(o.Log, "ab: round %d %s: %.0f req/s, gateway %.1f µs/req, machine %.2f CPUs\n",
				round+1, "AB"[k:k+1], run.RPS, run.GatewayCPU, run.MachineCPUs)
		}
		rep.Rounds = append(rep.Rounds, pair)
	}
	rep.Median = medians(rep.Rounds)
	return rep, nil
}

// medians returns each build's median over rounds: of each figure the middle round, or the mean of the
// two middle ones (loadtest.Percentile's nearest rank would take the lower of them: with few rounds that
// moves the ratio by a round's noise); Errors is the sum.
func medians(rounds [][2]Result) [2]Result {
	var m [2]Result
	for k := range m {
		med := func(f func(Result) float64) float64 {
			var v []float64
			for _, p := range rounds {
				v = append(v, f(p[k]))
			}
			sort.Float64s(v)
			if len(v)%2 == 1 {
				return v[len(v)/2]
			}
			return (v[len(v)/2-1] + v[len(v)/2]) / 2
		}
		m[k] = Result{RPS: med(func(r Result) float64 { return r.RPS }),
			GatewayCPU:  med(func(r Result) float64 { return r.GatewayCPU }),
			MachineCPUs: med(func(r Result) float64 { return r.MachineCPUs })}
		for _, p := range rounds {
			m[k].Errors += p[k].Errors
		}
	}
	return m
}

// measure measures one build (overhead.Measure).
func measure(ctx context.Context, o overhead.Options, bin, caseName, strategy string, warmup time.Duration, seq *atomic.Uint64) (Result, error) {
	t, err := overhead.Measure(ctx, o, bin, caseName, strategy, warmup, seq)
	return Result{RPS: t.RPS, GatewayCPU: t.GatewayCPU, MachineCPUs: t.MachineCPUs, Errors: t.Errors}, err
}

// Markdown renders the report: the medians, B against A, and every round.
func (rep *Report) Markdown() string {
	var b strings.Builder
	a, m := rep.Median[0], rep.Median[1]
	fmt.Fprintf(&b, "A/B, case %s, %d rounds (medians; c=64 closed loop):\n\n", rep.Case, len(rep.Rounds))
	b.WriteString("| build | req/s | gateway CPU µs/req | machine CPUs busy | errors |\n|---|---:|---:|---:|---:|\n")
	for k, r := range rep.Median {
		name := fmt.Sprintf("`%s`", []string{rep.A, rep.B}[k])
		if k == 1 && rep.StrategyB != "" {
			name += ", strategy " + rep.StrategyB
		}
		fmt.Fprintf(&b, "| %s %s | %.0f | %.1f | %.2f | %d |\n", "AB"[k:k+1], name, r.RPS, r.GatewayCPU, r.MachineCPUs, r.Errors)
	}
	if a.RPS > 0 && a.GatewayCPU > 0 {
		fmt.Fprintf(&b, "\nB ÷ A: req/s %.3fx, gateway CPU per request %.3fx\n", m.RPS/a.RPS, m.GatewayCPU/a.GatewayCPU)
	}
	b.WriteString("\n| round | A req/s | B req/s | B ÷ A | A µs/req | B µs/req |\n|---:|---:|---:|---:|---:|---:|\n")
	for i, p := range rep.Rounds {
		ratio := 0.0
		if p[0].RPS > 0 {
			ratio = p[1].RPS / p[0].RPS
		}
		fmt.Fprintf(&b, "| %d | %.0f | %.0f | %.3f | %.1f | %.1f |\n", i+1, p[0].RPS, p[1].RPS, ratio, p[0].GatewayCPU, p[1].GatewayCPU)
	}
	return b.String()
}
