package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/bench/replay"
	"github.com/rolter-ai/rolter/capture"
)

const replayUsage = `Usage: rolter replay -trace F [flags]

Replays a trace through every routing strategy on a fleet of simulated vLLM engines behind a real
gateway, and prints the routing table: per strategy the token hit rate the engines delivered, its
ratio to the oracle bounds, TTFT and the load spread. F is a Rolter capture ([trace] in
rolter.toml) or a public trace in the Mooncake format ({"timestamp", "input_length",
"output_length", "hash_ids"} per line); "-" reads stdin. Prompts are synthetic text that shares
exactly the prefixes the trace's prompts shared. Bounded by -max-requests and -timeout.

Flags:
`

// replayMain runs `rolter replay`: 0 when every strategy ran, 1 when the replay could not run or a
// strategy failed, 2 for bad flags. SIGINT/SIGTERM end it early and still report.
func replayMain(args []string, stdout, stderr io.Writer) int {
	var o replay.Options
	var path, strategies, jsonPath string
	var prefillUs, decodeUs float64
	var quiet bool
	fs := flag.NewFlagSet("rolter replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" || a == "--h" {
			fs.SetOutput(stdout) // asked for: not an error
		}
	}
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), replayUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&path, "trace", "", "trace file: a Rolter capture or a Mooncake trace (JSONL); - for stdin")
	fs.StringVar(&strategies, "strategies", strings.Join(fleet.Strategies, ","), "comma-separated strategies, in report order")
	fs.IntVar(&o.Engines, "engines", 8, "simulated engines in the fleet")
	fs.IntVar(&o.KVBlocks, "kv-blocks", 2048, "KV cache blocks per engine (cache pressure); prompt + output must fit in kv-blocks × block-size")
	fs.IntVar(&o.BlockSize, "block-size", 16, "tokens per KV block")
	fs.IntVar(&o.MaxNumSeqs, "max-num-seqs", 4, "requests each engine runs at once")
	fs.Float64Var(&prefillUs, "prefill-us-per-token", 100, "engine prefill time per uncached prompt token, µs")
	fs.Float64Var(&decodeUs, "decode-us-per-token", 1000, "engine time per output token, µs")
	fs.Float64Var(&o.Speed, "speed", 0, "0: send in trace order, closed loop; > 0: at the trace's arrival times divided by this factor")
	fs.IntVar(&o.Concurrency, "concurrency", 0, "requests in flight (default engines × max-num-seqs × 3/4; with -speed the most in flight, default 512)")
	fs.IntVar(&o.Scale, "scale", 1, "divide every token count of the trace (block sizes, prompt and output lengths) by this; prefix sharing is kept")
	fs.IntVar(&o.MaxRequests, "max-requests", 5000, "replay at most this many requests (the first ones of the file)")
	fs.DurationVar(&o.Timeout, "timeout", 20*time.Minute, "bound on the whole replay, shared equally by the strategies left")
	fs.BoolVar(&o.IncludeUnanswered, "include-unanswered", false, "also replay captured requests whose client got no 2xx")
	fs.BoolVar(&o.NoContinuation, "no-continuation", false, "do not replay a session's partial last block as the start of its next turn's block")
	fs.StringVar(&jsonPath, "json", "", `also write the report as JSON to this file ("-": JSON to stdout instead of the table)`)
	fs.BoolVar(&quiet, "q", false, "no progress lines on stderr")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "rolter replay: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if path == "" {
		fmt.Fprintln(stderr, "rolter replay: -trace is required")
		fs.Usage()
		return 2
	}
	for _, s := range strings.Split(strategies, ",") {
		if s = strings.TrimSpace(s); s != "" {
			o.Strategies = append(o.Strategies, s)
		}
	}
	if len(o.Strategies) == 0 {
		fmt.Fprintln(stderr, "rolter replay: -strategies names no strategy")
		return 2
	}
	if !(prefillUs >= 0) || !(decodeUs >= 0) {
		fmt.Fprintln(stderr, "rolter replay: -prefill-us-per-token and -decode-us-per-token must be >= 0")
		return 2
	}
	// 0 means "the default" to replay.Options; a tiny duration keeps an explicit 0 instant.
	o.PrefillPerToken = max(time.Duration(prefillUs*float64(time.Microsecond)), 1)
	o.DecodePerToken = max(time.Duration(decodeUs*float64(time.Microsecond)), 1)
	if o.MaxRequests < 1 || o.Timeout <= 0 {
		fmt.Fprintln(stderr, "rolter replay: -max-requests and -timeout must be positive")
		return 2
	}
	if !quiet {
		o.Log = stderr
	}

	tr, err := readTrace(path, o.MaxRequests)
	if err != nil {
		fmt.Fprintf(stderr, "rolter replay: %s\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := replay.Run(ctx, path, &tr, o)
	if rep == nil {
		fmt.Fprintf(stderr, "rolter replay: %s\n", err)
		return 1
	}
	if err != nil {
		fmt.Fprintf(stderr, "rolter replay: stopped early: %s\n", err)
	}
	if jsonPath == "-" {
		if werr := rep.WriteJSON(stdout); werr != nil {
			fmt.Fprintf(stderr, "rolter replay: %s\n", werr)
			return 1
		}
	} else {
		fmt.Fprint(stdout, rep.Markdown())
		if jsonPath != "" {
			if werr := writeReplayJSON(jsonPath, rep); werr != nil {
				fmt.Fprintf(stderr, "rolter replay: %s\n", werr)
				return 1
			}
		}
	}
	if err != nil {
		return 1
	}
	for _, r := range rep.Runs {
		if r.Error != "" {
			return 1
		}
	}
	return 0
}

// readTrace reads at most maxRequests requests of the trace at path ("-": stdin).
func readTrace(path string, maxRequests int) (capture.Trace, error) {
	var r io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return capture.Trace{}, fmt.Errorf("cannot open trace: %w", err)
		}
		defer f.Close()
		r = f
	}
	tr, err := capture.ReadOptions{MaxRequests: maxRequests}.Read(r)
	if err != nil {
		return tr, fmt.Errorf("%s: %w", path, err)
	}
	return tr, nil
}

func writeReplayJSON(path string, rep *replay.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("cannot create %q: %w", path, err)
	}
	err = rep.WriteJSON(f)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("cannot write %q: %w", path, cerr)
	}
	return err
}
