package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rolter-ai/rolter/clientconn"
	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/engine"
	"github.com/rolter-ai/rolter/kvindex"
	"github.com/rolter-ai/rolter/sim"
)

func simMain(args []string, stdout, _ io.Writer) int {
	return sim.Main(args, stdout)
}

// upOptions are the flags of `rolter up`.
type upOptions struct {
	n          int
	strategy   string
	shadow     string
	listen     string
	configOut  string
	numBlocks  int
	prefillUs  float64
	decodeUs   float64
	maxNumSeqs int
	logLevel   string
}

// up starts n simulated engines and a gateway in front of them with a generated config (one route, every
// engine a target, health checks and engine-metrics scraping on), prints where to send requests and where
// the config is, and stops everything on Ctrl-C.
func up(args []string, stdout, stderr io.Writer) int {
	var o upOptions
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.n, "n", 4, "number of simulated engines")
	fs.StringVar(&o.strategy, "strategy", "pipeline", "routing strategy of the route (pipeline: the best measured, docs/benchmarks/routing-quality.md)")
	fs.StringVar(&o.shadow, "shadow", "", "shadow strategies of the route, comma-separated (docs/routing/evidence.md)")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "gateway address (a free port is used if this one is taken)")
	fs.StringVar(&o.configOut, "config-out", "", "where to write the generated config (default: a file in the temp dir)")
	fs.IntVar(&o.numBlocks, "num-blocks", 2048, "KV cache blocks per engine")
	fs.Float64Var(&o.prefillUs, "prefill-us-per-token", 20, "engine prefill cost per uncached prompt token, µs")
	fs.Float64Var(&o.decodeUs, "decode-us-per-token", 2000, "engine time per output token, µs")
	fs.IntVar(&o.maxNumSeqs, "max-num-seqs", 8, "requests each engine runs at once")
	fs.StringVar(&o.logLevel, "log-level", "warn", "gateway log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.n < 1 || o.n > 64 {
		fmt.Fprintln(stderr, "rolter up: -n must be between 1 and 64")
		return 2
	}
	log := newLogger(stderr, o.logLevel)

	var sims []*sim.Engine
	defer func() {
		for _, e := range sims {
			e.Stop()
		}
	}()
	for i := 0; i < o.n; i++ {
		cfg := sim.DefaultConfig()
		cfg.KVEvents = "tcp://127.0.0.1:*"
		cfg.Replay = "tcp://127.0.0.1:*"
		cfg.EngineLabel = fmt.Sprint(i)
		cfg.NumBlocks = o.numBlocks
		cfg.MaxNumSeqs = o.maxNumSeqs
		cfg.PrefillPerToken = time.Duration(o.prefillUs * float64(time.Microsecond))
		cfg.DecodePerToken = time.Duration(o.decodeUs * float64(time.Microsecond))
		if !kvindex.Supported {
			cfg.KVEvents, cfg.Replay = "", ""
		}
		e, err := sim.New(cfg)
		if err == nil {
			err = e.Start()
		}
		if err != nil {
			fmt.Fprintf(stderr, "rolter up: cannot start simulated engine %d: %s\n", i+1, err)
			return 1
		}
		sims = append(sims, e)
	}

	ln, err := clientconn.Listen(o.listen)
	if err != nil {
		ln, err = clientconn.Listen("127.0.0.1:0")
		if err != nil {
			fmt.Fprintf(stderr, "rolter up: cannot listen: %s\n", err)
			return 1
		}
	}
	text := upConfig(ln.Addr().String(), o.strategy, o.shadow, sims)
	path := o.configOut
	if path == "" {
		path = filepath.Join(os.TempDir(), fmt.Sprintf("rolter-up-%d.toml", os.Getpid()))
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		fmt.Fprintf(stderr, "rolter up: cannot write the config: %s\n", err)
		return 1
	}
	cfg, err := config.Parse([]byte(text), path)
	if err != nil {
		fmt.Fprintf(stderr, "rolter up: the generated config is invalid (check -strategy and -shadow):\n%s\n", err)
		return 2
	}
	g, err := engine.New(cfg, engine.Options{Logger: log, Version: version})
	if err != nil {
		fmt.Fprintf(stderr, "rolter up: cannot start the gateway: %s\n", err)
		return 1
	}

	url := "http://" + ln.Addr().String()
	model := sims[0].Config().Model
	fmt.Fprintf(stdout, "\nRolter %s is up: %d simulated vLLM engines behind one gateway (strategy %s).\n\n", version, o.n, o.strategy)
	fmt.Fprintf(stdout, "  gateway   %s/v1   (OpenAI-compatible; model %q)\n", url, model)
	fmt.Fprintf(stdout, "  metrics   %s/metrics\n", url)
	fmt.Fprintf(stdout, "  config    %s\n", path)
	for i, e := range sims {
		fmt.Fprintf(stdout, "  engine %-2d %s\n", i+1, e.URL())
	}
	fmt.Fprintf(stdout, "\nTry it (send it twice: the second lands on the same engine, its prompt cached):\n\n")
	fmt.Fprintf(stdout, "  curl -s %s/v1/chat/completions -H 'Content-Type: application/json' -D - \\\n", url)
	fmt.Fprintf(stdout, "    -d '{\"model\":%q,\"messages\":[{\"role\":\"user\",\"content\":\"Hello, Rolter!\"}]}'\n\n", model)
	fmt.Fprintf(stdout, "Ctrl-C stops everything.\n")

	code := serveUntilSignal(g, ln, 5*time.Second, func() { _ = g.ReloadFile(path) }, log)
	fmt.Fprintln(stdout, "stopped.")
	return code
}

// upConfig renders the config of `rolter up`: one route over every engine, health checks and engine-metrics
// scraping on, KV events wired (used by precise_cache_aware).
func upConfig(listen, strategy, shadow string, sims []*sim.Engine) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Generated by `rolter up`: %d simulated vLLM engines behind one route.\n", len(sims))
	fmt.Fprintf(&b, "[server]\nlisten = %q\n\n", listen)
	b.WriteString("[health]\nenabled = true\ninterval_secs = 1\n\n[metrics_scrape]\nenabled = true\ninterval_secs = 0.25\n\n")
	for i, e := range sims {
		fmt.Fprintf(&b, "[[providers]]\nname = \"sim-%d\"\napi_base = %q\n", i+1, e.URL())
		if ep := e.KVEventsEndpoint(); ep != "" {
			fmt.Fprintf(&b, "[providers.kv_events]\nendpoint = %q\n", ep)
			if rep := e.ReplayEndpoint(); rep != "" {
				fmt.Fprintf(&b, "replay_endpoint = %q\n", rep)
			}
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "[[routes]]\nmodel = %q\nstrategy = %q\n", sims[0].Config().Model, strategy)
	for i := range sims {
		fmt.Fprintf(&b, "\n[[routes.targets]]\nprovider = \"sim-%d\"\n", i+1)
	}
	if shadow != "" {
		var names []string
		for _, n := range strings.Split(shadow, ",") {
			names = append(names, strconv.Quote(strings.TrimSpace(n)))
		}
		fmt.Fprintf(&b, "\n[routes.shadow]\nstrategies = [%s]\n", strings.Join(names, ", "))
	}
	return b.String()
}
