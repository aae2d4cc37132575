// Command routing writes the routing-quality report (bench/README.md): every strategy on
// shared-prefix, multi-turn and hot-prefix over a fleet of simulated engines under KV pressure.
//
//	go run ./bench/cmd/routing -out bench/results
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/bench/routing"
)

func main() {
	os.Exit(run())
}

func run() int {
	var o routing.Options
	out := flag.String("out", "bench/results", "directory for routing.md, routing.json and the PNG charts")
	strategies := flag.String("strategies", strings.Join(fleet.Strategies, ","), "strategies to compare")
	scenarios := flag.String("scenarios", strings.Join(routing.Scenarios, ","), "scenarios to run")
	flag.IntVar(&o.Engines, "engines", 8, "simulated engines in the fleet")
	flag.IntVar(&o.Scale, "scale", 4, "divide token counts and engine KV blocks of the unscaled shapes by this")
	flag.IntVar(&o.Concurrency, "concurrency", 0, "requests in flight (default engines × max-num-seqs × 3/4)")
	flag.IntVar(&o.MaxNumSeqs, "max-num-seqs", 4, "requests each engine runs at once")
	flag.DurationVar(&o.PrefillPerToken, "prefill-per-token", 100*time.Microsecond, "engine prefill time per uncached prompt token")
	flag.DurationVar(&o.DecodePerToken, "decode-per-token", time.Millisecond, "engine time per output token")
	flag.Uint64Var(&o.Seed, "seed", 1, "workload seed of the first repeat")
	flag.IntVar(&o.Repeats, "repeats", 3, "runs of every (scenario, strategy), each with its own seed")
	flag.DurationVar(&o.RunTimeout, "run-timeout", 3*time.Minute, "bound on one (scenario, strategy) run")
	flag.DurationVar(&o.TransferPerBlock, "transfer-per-block", 0, "disaggregated fleets: block pull time (default prefill-per-token)")
	flag.IntVar(&o.DisaggConcurrency, "disagg-concurrency", 0, "disaggregated comparison: requests in flight (default 4 × max-num-seqs × 3/4)")
	flag.BoolVar(&o.NoDisagg, "no-disagg", false, "leave the disaggregated prefill/decode comparison out")
	flag.BoolVar(&o.NoLoRA, "no-lora", false, "leave the many-adapter LoRA comparison out")
	flag.StringVar(&o.LoRAParams, "lora-params", "", "TOML lines appended to the adapter-aware route's [routes.lora], e.g. \"replica_requests = 16\"")
	into := flag.String("disagg-into", "", "run only the disaggregated comparison and write it into this routing.json's report")
	loraInto := flag.String("lora-into", "", "run only the many-adapter LoRA comparison and write it into this routing.json's report")
	render := flag.String("render", "", "render the Markdown and charts again from this routing.json instead of running")
	flag.Parse()
	if *render != "" {
		rep, err := routing.Load(*render)
		if err == nil {
			var files []string
			files, err = routing.Write(rep, *out)
			fmt.Printf("routing report rendered: %s\n", strings.Join(files, " "))
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "routing: %s\n", err)
			return 1
		}
		return 0
	}
	o.Strategies = split(*strategies)
	o.Scenarios = split(*scenarios)
	o.Log = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var rep *routing.Report
	var err error
	switch {
	case *into != "":
		if rep, err = routing.Load(*into); err != nil {
			fmt.Fprintf(os.Stderr, "routing: %s\n", err)
			return 1
		}
		err = routing.RunDisagg(ctx, rep, o)
	case *loraInto != "":
		if rep, err = routing.Load(*loraInto); err != nil {
			fmt.Fprintf(os.Stderr, "routing: %s\n", err)
			return 1
		}
		err = routing.RunLoRA(ctx, rep, o)
	default:
		rep, err = routing.Run(ctx, o)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "routing: %s (writing what was measured)\n", err)
	}
	files, werr := routing.Write(rep, *out)
	if werr != nil {
		fmt.Fprintf(os.Stderr, "routing: %s\n", werr)
		return 1
	}
	fmt.Printf("routing report (%.0f s): %s\n", max(rep.Seconds, rep.DisaggSeconds, rep.LoRASeconds()), strings.Join(files, " "))
	for _, g := range rep.Goals {
		fmt.Printf("  %-4s %s: %s (target %s)\n", g.Verdict, g.Name, g.Measured, g.Target)
	}
	if err != nil {
		return 1
	}
	return 0
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
