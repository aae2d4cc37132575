// Command pressure writes the KV-pressure routing report (the method is in the report's
// "Setup"): every strategy on shared-prefix (and its s=1.1 variant), multi-turn (and its short-message
// variant) and hot-prefix-burst workloads over 4 simulated engines whose KV caches hold 25%, 50% and 100% of
// each workload's working set.
//
//	go run ./bench/cmd/pressure -out bench/results
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rolter-ai/rolter/bench/pressure"
)

func main() {
	os.Exit(run())
}

func run() int {
	var o pressure.Options
	out := flag.String("out", "bench/results", "directory for the report")
	name := flag.String("name", "pressure", "file name of the report: <name>.md and <name>.json")
	strategies := flag.String("strategies", strings.Join(pressure.Strategies, ";"),
		`strategies to compare, separated by ";" or ","; one may carry route parameters: "cache_aware:max_trie_bytes=1kv" (<f>kv = f × one engine's KV in prompt-key bytes)`)
	workloads := flag.String("workloads", strings.Join(pressure.WorkloadNames, ","), "workloads to run")
	capacities := flag.String("capacities", "0.25,0.5,1", "engine KV capacities as fractions of the per-engine working set")
	flag.BoolVar(&o.Quick, "quick", false, "small workloads on instant engines (a smoke test, ~20 s)")
	flag.IntVar(&o.Engines, "engines", 4, "simulated engines in the fleet")
	flag.IntVar(&o.Concurrency, "concurrency", 0, "requests in flight (default engines × max-num-seqs × 3/2)")
	flag.IntVar(&o.MaxNumSeqs, "max-num-seqs", 4, "requests each engine runs at once")
	flag.DurationVar(&o.PrefillPerToken, "prefill-per-token", 0, "engine prefill time per uncached prompt token (default 20µs; quick 1µs)")
	flag.DurationVar(&o.DecodePerToken, "decode-per-token", 0, "engine time per output token (default 1ms; quick 100µs)")
	flag.Uint64Var(&o.Seed, "seed", 1, "workload seed, shared by every cell")
	flag.Float64Var(&o.Epsilon, "epsilon", 0.25, "the placement reference's load cap: at most ceil((1+epsilon) × mean) requests per engine")
	flag.StringVar(&o.Recommended, "recommended", pressure.Recommended, "the strategy the goals judge")
	flag.DurationVar(&o.RunTimeout, "run-timeout", 2*time.Minute, "bound on one cell's load")
	flag.DurationVar(&o.Timeout, "timeout", 30*time.Minute, "bound on the whole report (what was measured is written)")
	render := flag.String("render", "", "render the Markdown again from this pressure.json instead of running")
	flag.Parse()
	if *render != "" {
		rep, err := pressure.Load(*render)
		if err == nil {
			var files []string
			files, err = pressure.Write(rep, *out, *name)
			fmt.Printf("pressure report rendered: %s\n", strings.Join(files, " "))
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "pressure: %s\n", err)
			return 1
		}
		return 0
	}
	o.Strategies = splitList(*strategies, true)
	o.Workloads = splitList(*workloads, false)
	for _, c := range splitList(*capacities, false) {
		v, err := strconv.ParseFloat(c, 64)
		if err != nil || !(v > 0) {
			fmt.Fprintf(os.Stderr, "pressure: cannot use capacity %q: want a positive number\n", c)
			return 2
		}
		o.Capacities = append(o.Capacities, v)
	}
	o.Log = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := pressure.Run(ctx, o)
	if rep == nil {
		fmt.Fprintf(os.Stderr, "pressure: %s\n", err)
		return 2
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "pressure: %s (writing what was measured)\n", err)
	}
	files, werr := pressure.Write(rep, *out, *name)
	if werr != nil {
		fmt.Fprintf(os.Stderr, "pressure: %s\n", werr)
		return 1
	}
	fmt.Printf("pressure report (%.0f s): %s\n", rep.Seconds, strings.Join(files, " "))
	for _, g := range rep.Goals {
		fmt.Printf("  %-4s %s: %s (target %s)\n", g.Verdict, g.Name, g.Measured, g.Target)
	}
	if err != nil {
		return 1
	}
	return 0
}

// splitList splits a flag's list at commas - or, when params may hold commas ("name:k=v,k=v"), at
// semicolons if there is one.
func splitList(s string, params bool) []string {
	sep := ","
	if params && strings.Contains(s, ";") {
		sep = ";"
	} else if params && strings.Contains(s, ":") {
		sep = ";"
	}
	var out []string
	for _, p := range strings.Split(s, sep) {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
