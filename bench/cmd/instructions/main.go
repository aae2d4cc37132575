// Command instructions counts the instructions per proxied request of `rolter serve` under valgrind's
// callgrind, in the overhead report's two cases, and writes bench/results/instructions.md (bench/README.md).
//
//	go build -o bin/rolter ./cmd/rolter && go build -o bin/fakeupstream ./bench/cmd/fakeupstream
//	go run ./bench/cmd/instructions -rolter bin/rolter -upstream bin/fakeupstream -out bench/results
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/rolter-ai/rolter/bench/instructions"
)

func main() {
	o := instructions.DefaultOptions()
	out := flag.String("out", "bench/results", "directory for instructions.md and instructions.json")
	flag.StringVar(&o.Rolter, "rolter", "bin/rolter", "the rolter binary")
	flag.StringVar(&o.Upstream, "upstream", "bin/fakeupstream", "the fake upstream binary (go build ./bench/cmd/fakeupstream)")
	flag.StringVar(&o.Valgrind, "valgrind", "", "the valgrind binary (default: PATH)")
	flag.StringVar(&o.RefProxy, "refproxy", "", "bench/cmd/refproxy's binary: also count the small case through its two modes")
	flag.IntVar(&o.Requests, "requests", o.Requests, "requests counted per case")
	flag.IntVar(&o.Warmup, "warmup", o.Warmup, "requests before the count")
	flag.IntVar(&o.Concurrency, "concurrency", o.Concurrency, "keep-alive connections of the load")
	flag.IntVar(&o.Top, "top", o.Top, "functions listed per case")
	flag.Parse()
	o.Log = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := instructions.Run(ctx, o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "instructions: %s\n", err)
		os.Exit(1)
	}
	files, err := instructions.Write(rep, *out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "instructions: %s\n", err)
		os.Exit(1)
	}
	fmt.Printf("instructions (%.0f s): %s\n", rep.Seconds, strings.Join(files, " "))
	for _, c := range append(rep.Cases, rep.References...) {
		fmt.Printf("  %s: %.0f instructions per request (%d errors)\n", c.Name, c.PerRequest, c.Errors)
	}
}
