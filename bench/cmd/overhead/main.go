// Command overhead writes the gateway overhead report (bench/README.md): a zero-delay upstream
// reached directly, through `rolter serve` and through HAProxy, in interleaved rounds, plus the
// gateways' RSS around a sustained run.
//
//	go build -o bin/rolter ./cmd/rolter && go build -o bin/fakeupstream ./bench/cmd/fakeupstream
//	go run ./bench/cmd/overhead -rolter bin/rolter -upstream bin/fakeupstream -out bench/results
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

	"github.com/rolter-ai/rolter/bench"
)

func main() {
	var o bench.OverheadOptions
	out := flag.String("out", "bench/results", "directory for overhead.md and overhead.json")
	flag.StringVar(&o.Rolter, "rolter", "bin/rolter", "the rolter binary")
	flag.StringVar(&o.Upstream, "upstream", "bin/fakeupstream", "the fake upstream binary (go build ./bench/cmd/fakeupstream)")
	flag.StringVar(&o.HAProxy, "haproxy", "", "the haproxy binary (default: PATH, then /usr/sbin/haproxy)")
	flag.StringVar(&o.Strategy, "strategy", "round_robin", "strategy of Rolter's route")
	flag.IntVar(&o.Rounds, "rounds", 5, "interleaved rounds")
	flag.IntVar(&o.LatencyRequests, "latency-requests", 2000, "requests per path and round at concurrency 1")
	flag.IntVar(&o.ThroughputConcurrency, "concurrency", 64, "closed-loop concurrency of the throughput and sustained runs")
	flag.DurationVar(&o.ThroughputDuration, "throughput-duration", 3*time.Second, "throughput run per path and round")
	flag.IntVar(&o.Streams, "streams", 3, "paced streams per path and round")
	flag.DurationVar(&o.SustainDuration, "sustain", 20*time.Second, "sustained run per gateway for the RSS samples")
	flag.Parse()
	o.Log = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := bench.RunOverhead(ctx, o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "overhead: %s\n", err)
		os.Exit(1)
	}
	files, err := bench.WriteOverhead(rep, *out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "overhead: %s\n", err)
		os.Exit(1)
	}
	fmt.Printf("overhead report (%.0f s): %s\n", rep.Seconds, strings.Join(files, " "))
	for _, g := range rep.Goals {
		fmt.Printf("  %-4s %s: %s (target %s)\n", g.Verdict, g.Name, g.Measured, g.Target)
	}
}
