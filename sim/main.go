package sim

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// Main runs `rolter sim`: it parses args (the flags after the subcommand), starts one engine,
// prints a one-line banner to stdout and serves until SIGINT or SIGTERM. It returns the exit
// code: 0 after a clean stop or -h, 2 for bad flags, 1 when the engine cannot start. Errors go
// to stderr.
func Main(args []string, stdout io.Writer) int {
	cfg, err := ParseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stdout, "Usage: rolter sim [flags]\n\nA simulated vLLM engine: OpenAI HTTP API, prefix KV cache, latency model, vLLM KV events over ZMQ.\n\nFlags:")
		_, fs := newFlagSet(stdout)
		fs.PrintDefaults()
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rolter sim: %s\n", err)
		return 2
	}
	e, err := New(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rolter sim: %s\n", err)
		return 1
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if err := e.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "rolter sim: %s\n", err)
		return 1
	}
	fmt.Fprintln(stdout, e.Banner())
	<-sigs
	e.Stop()
	fmt.Fprintln(stdout, "rolter sim: stopped")
	return 0
}

// Banner returns a one-line description of a started engine: where it listens and what it
// simulates.
func (e *Engine) Banner() string {
	c := &e.cfg
	var b strings.Builder
	fmt.Fprintf(&b, "rolter sim: model %q on %s", c.Model, e.URL())
	if ep := e.KVEventsEndpoint(); ep != "" {
		fmt.Fprintf(&b, " | kv events %s (%s, %s hashes", ep, c.Era, c.HashMode)
		if c.Topic != "" {
			fmt.Fprintf(&b, ", topic %q", c.Topic)
		}
		b.WriteString(")")
		if rep := e.ReplayEndpoint(); rep != "" {
			fmt.Fprintf(&b, " | replay %s (%s layout)", rep, c.ReplayLayout)
		}
	}
	if c.Role != RoleAggregated {
		fmt.Fprintf(&b, " | role %s, engine id %s", c.Role, c.EngineID)
		if a := e.SideChannelAddr(); a != "" {
			fmt.Fprintf(&b, ", block pulls and SGLang bootstrap on %s (lease %s, bootstrap timeout %s, %s/block)", a, c.KVLease, c.BootstrapTimeout, c.TransferPerBlock)
		}
		if c.Role.decodes() {
			fmt.Fprintf(&b, ", kv load failure policy %s, SGLang waiting timeout %s", c.KVLoadFailure, c.WaitingTimeout)
		}
	}
	if c.EnableLoRA {
		fmt.Fprintf(&b, " | lora: %d adapters, max-loras %d, load %s", len(c.LoRAModules), c.MaxLoRAs, c.LoRALoadDelay)
		if c.AllowRuntimeLoRA {
			b.WriteString(", runtime updating")
		}
	}
	fmt.Fprintf(&b, " | %d blocks x %d tokens, %d seqs, prefill %s/token, decode %s/token",
		c.NumBlocks, c.BlockSize, c.MaxNumSeqs, c.PrefillPerToken, c.DecodePerToken)
	if f := e.Faults(); f != (Faults{}) {
		b.WriteString(" | faults:")
		if f.ErrorRate > 0 {
			fmt.Fprintf(&b, " error-rate=%g", f.ErrorRate)
		}
		if f.AddedLatency > 0 {
			fmt.Fprintf(&b, " added-latency=%s", f.AddedLatency.Round(time.Microsecond))
		}
		if f.HangBeforeHeaders {
			b.WriteString(" hang")
		}
		if f.AbortAfterChunks > 0 {
			fmt.Fprintf(&b, " abort-after-chunks=%d", f.AbortAfterChunks)
		}
		if f.DropEveryNthBatch > 0 {
			fmt.Fprintf(&b, " drop-every-nth-batch=%d", f.DropEveryNthBatch)
		}
		if f.GarbageEveryNBatches > 0 {
			fmt.Fprintf(&b, " garbage-every-n-batches=%d", f.GarbageEveryNBatches)
		}
	}
	return b.String()
}
