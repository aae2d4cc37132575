// Command ab compares two `rolter serve` builds in one of the overhead report's cases (bench/README.md):
// each round starts each build afresh and measures its c=64 closed loop, in alternating order, and the
// medians over rounds show a change too small for one overhead report's noise.
//
//	go run ./bench/cmd/ab -base HEAD~1 -b bin/rolter -upstream bin/fakeupstream -case cache_aware
//	go run ./bench/cmd/ab -a bin/rolter -b bin/rolter -case cache_aware -strategy-b round_robin
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/rolter-ai/rolter/bench/ab"
	"github.com/rolter-ai/rolter/bench/overhead"
)

func main() {
	var o ab.Options
	base := flag.String("base", "", "a git revision to build as A (instead of -a)")
	flag.StringVar(&o.A, "a", "", "rolter binary A")
	flag.StringVar(&o.B, "b", "bin/rolter", "rolter binary B")
	flag.StringVar(&o.Upstream, "upstream", "bin/fakeupstream", "the fake upstream binary (go build ./bench/cmd/fakeupstream)")
	flag.StringVar(&o.Case, "case", overhead.CaseSmall, "the overhead report's case: "+overhead.CaseSmall+" or "+overhead.CaseCache)
	flag.StringVar(&o.StrategyB, "strategy-b", "", "route B on this strategy instead of the case's (with -b the same binary as -a: what a strategy costs over another)")
	flag.IntVar(&o.Rounds, "rounds", 6, "rounds of one run of each build")
	flag.DurationVar(&o.Duration, "duration", 0, "measured closed loop per run (default 4s)")
	flag.Parse()
	o.Log = os.Stderr
	if err := run(o, *base); err != nil {
		fmt.Fprintf(os.Stderr, "ab: %s\n", err)
		os.Exit(1)
	}
}

func run(o ab.Options, base string) error {
	if base != "" {
		dir, err := os.MkdirTemp("", "rolter-ab-base-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		o.A = filepath.Join(dir, "rolter")
		if err := buildRevision(base, dir, o.A); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := ab.Run(ctx, o)
	if err != nil {
		return err
	}
	if base != "" {
		rep.A = base
	}
	fmt.Print(rep.Markdown())
	return nil
}

// buildRevision builds ./cmd/rolter of git revision rev, extracted into dir, as out.
func buildRevision(rev, dir, out string) error {
	archive := exec.Command("git", "archive", rev)
	untar := exec.Command("tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return err
	}
	untar.Stdin = pipe
	untar.Stderr, archive.Stderr = os.Stderr, os.Stderr
	if err := untar.Start(); err != nil {
		return err
	}
	if err := archive.Run(); err != nil {
		_ = untar.Wait()
		return fmt.Errorf("git archive %s: %w", rev, err)
	}
	if err := untar.Wait(); err != nil {
		return fmt.Errorf("cannot extract %s: %w", rev, err)
	}
	build := exec.Command("go", "build", "-o", out, "./cmd/rolter")
	build.Dir, build.Stdout, build.Stderr = dir, io.Discard, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("cannot build %s: %w", rev, err)
	}
	return nil
}
