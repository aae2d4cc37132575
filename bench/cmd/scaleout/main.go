// Command scaleout writes the scale-out report (bench/README.md): 1, 2 and 4 `rolter serve`
// processes behind HAProxy in TCP mode in front of one simulated fleet, per strategy, on the
// shared-prefix and multi-turn workloads.
//
//	go build -o bin/rolter ./cmd/rolter
//	go run ./bench/cmd/scaleout -rolter bin/rolter -out bench/results
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

	"github.com/rolter-ai/rolter/bench/scaleout"
)

func main() {
	os.Exit(run())
}

func run() int {
	var o scaleout.Options
	out := flag.String("out", "bench/results", "directory for scaleout.md and scaleout.json")
	flag.StringVar(&o.Rolter, "rolter", "bin/rolter", "the rolter binary")
	flag.StringVar(&o.HAProxy, "haproxy", "", "the haproxy binary (default: PATH, then /usr/sbin/haproxy)")
	gateways := flag.String("gateways", "1,2,4", "gateway counts")
	strategies := flag.String("strategies", strings.Join(scaleout.Strategies, ","), "strategies to compare")
	scenarios := flag.String("scenarios", strings.Join(scaleout.Scenarios, ","), "scenarios to run")
	flag.IntVar(&o.Engines, "engines", 8, "simulated engines in the fleet")
	flag.IntVar(&o.Scale, "scale", 4, "divide token counts and engine KV blocks of the unscaled shapes by this")
	flag.IntVar(&o.Concurrency, "concurrency", 0, "requests in flight (default engines × max-num-seqs × 3/4)")
	flag.IntVar(&o.MaxNumSeqs, "max-num-seqs", 4, "requests each engine runs at once")
	flag.DurationVar(&o.PrefillPerToken, "prefill-per-token", 100*time.Microsecond, "engine prefill time per uncached prompt token")
	flag.DurationVar(&o.DecodePerToken, "decode-per-token", time.Millisecond, "engine time per output token")
	flag.Uint64Var(&o.Seed, "seed", 1, "workload seed of the first repeat")
	flag.IntVar(&o.Repeats, "repeats", 3, "runs of the whole matrix, each with its own seed")
	flag.DurationVar(&o.RunTimeout, "run-timeout", 2*time.Minute, "bound on the load of one cell")
	timeout := flag.Duration("timeout", 20*time.Minute, "bound on the whole report (what was measured is written)")
	render := flag.String("render", "", "render the Markdown again from this scaleout.json instead of running")
	flag.Parse()
	if *render != "" {
		rep, err := scaleout.Load(*render)
		if err == nil {
			var files []string
			files, err = scaleout.Write(rep, *out)
			fmt.Printf("scale-out report rendered: %s\n", strings.Join(files, " "))
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "scaleout: %s\n", err)
			return 1
		}
		return 0
	}
	for _, s := range split(*gateways) {
		n, err := strconv.Atoi(s)
		if err != nil {
			fmt.Fprintf(os.Stderr, "scaleout: cannot parse gateway count %q: %s\n", s, err)
			return 2
		}
		o.Gateways = append(o.Gateways, n)
	}
	o.Strategies = split(*strategies)
	o.Scenarios = split(*scenarios)
	o.Log = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	rep, err := scaleout.Run(ctx, o)
	if rep == nil {
		fmt.Fprintf(os.Stderr, "scaleout: %s\n", err)
		return 1
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "scaleout: %s (writing what was measured)\n", err)
	}
	files, werr := scaleout.Write(rep, *out)
	if werr != nil {
		fmt.Fprintf(os.Stderr, "scaleout: %s\n", werr)
		return 1
	}
	fmt.Printf("scale-out report (%.0f s): %s\n", rep.Seconds, strings.Join(files, " "))
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
