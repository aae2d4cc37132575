// Command overhead writes the gateway overhead report (bench/README.md): a zero-delay upstream
// reached directly, through `rolter serve` and through HAProxy, in two cases - a round_robin route with a
// small body (and paced streams), and a cache_aware route over 4 targets with 8 KiB prompts unique per
// request - in interleaved rounds, plus the gateways' RSS around a sustained run in each case.
//
//	go build -o bin/rolter ./cmd/rolter && go build -o bin/fakeupstream ./bench/cmd/fakeupstream
//	go build -o bin/refproxy ./bench/cmd/refproxy
//	go run ./bench/cmd/overhead -rolter bin/rolter -upstream bin/fakeupstream -refproxy bin/refproxy -out bench/results
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/rolter-ai/rolter/bench/overhead"
)

func main() {
	o := overhead.DefaultOptions()
	out := flag.String("out", "bench/results", "directory for overhead.md and overhead.json")
	flag.StringVar(&o.Rolter, "rolter", "bin/rolter", "the rolter binary")
	flag.StringVar(&o.Upstream, "upstream", "bin/fakeupstream", "the fake upstream binary (go build ./bench/cmd/fakeupstream)")
	flag.StringVar(&o.HAProxy, "haproxy", "", "the haproxy binary (default: PATH, then /usr/sbin/haproxy)")
	flag.StringVar(&o.RefProxy, "refproxy", "", "bench/cmd/refproxy's binary: measured as the null-fasthttp and null-net yardsticks (none if empty)")
	flag.StringVar(&o.Strategy, "strategy", o.Strategy, "strategy of Rolter's route in the small-body case")
	flag.IntVar(&o.CacheTargets, "cache-targets", o.CacheTargets, "targets of the cache_aware case's route (HAProxy: servers)")
	flag.IntVar(&o.PromptBytes, "prompt-bytes", o.PromptBytes, "user message size of the cache_aware case, unique per request")
	flag.DurationVar(&o.FillTimeout, "fill-timeout", o.FillTimeout, "cache_aware warm-up: at most this long until Rolter's tries evict")
	flag.IntVar(&o.Rounds, "rounds", o.Rounds, "interleaved rounds")
	flag.IntVar(&o.LatencyRequests, "latency-requests", o.LatencyRequests, "requests per path, case and round at concurrency 1")
	flag.IntVar(&o.ThroughputConcurrency, "concurrency", o.ThroughputConcurrency, "closed-loop concurrency of the throughput and sustained runs")
	flag.DurationVar(&o.ThroughputDuration, "throughput-duration", o.ThroughputDuration, "throughput run per path, case and round")
	flag.IntVar(&o.Streams, "streams", o.Streams, "paced streams per path and round (small-body case)")
	flag.DurationVar(&o.SustainDuration, "sustain", o.SustainDuration, "sustained run per gateway and case for the RSS samples")
	flag.Parse()
	o.Log = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := overhead.Run(ctx, o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "overhead: %s\n", err)
		os.Exit(1)
	}
	files, err := overhead.Write(rep, *out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "overhead: %s\n", err)
		os.Exit(1)
	}
	fmt.Printf("overhead report (%.0f s): %s\n", rep.Seconds, strings.Join(files, " "))
	for _, g := range rep.Goals {
		fmt.Printf("  %-4s %s: %s (target %s)\n", g.Verdict, g.Name, g.Measured, g.Target)
	}
}
