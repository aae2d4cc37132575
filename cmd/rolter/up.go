package main

import (
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rolter-ai/rolter/clientconn"
	"github.com/rolter-ai/rolter/config"
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
	// control starts the control plane and the dashboard on controlListen.
	control       bool
	controlListen string
	// pd is -pd P:D: P prefill and D decode engines behind one disaggregated route instead of -n
	// aggregated ones (up_pd.go).
	pd pdShape
}

// up starts n simulated engines and a gateway in front of them with a generated config (one route, every
// engine a target, health checks and engine-metrics scraping on), prints where to send requests and where
// the config is, and stops everything on Ctrl-C. With -pd P:D the engines are P prefill and D decode ones
// behind one disaggregated route (up_pd.go).
func up(args []string, stdout, stderr io.Writer) int {
	var o upOptions
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
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
	fs.BoolVar(&o.control, "control", false, "also start the control plane (/api/v1) and the dashboard, with a store in the temp dir")
	fs.StringVar(&o.controlListen, "control-listen", "127.0.0.1:8081", "control plane address with -control (a free port is used if this one is taken)")
	fs.Var(&o.pd, "pd", "P:D starts P prefill and D decode engines behind one disaggregated route (-strategy ranks the prefill pool) instead of -n engines")
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	o.shadow = shadowOf(o.strategy, o.shadow, stderr)
	if o.n < 1 || o.n > 64 {
		fmt.Fprintln(stderr, "rolter up: -n must be between 1 and 64")
		return 2
	}
	if o.pd.prefill+o.pd.decode > 64 {
		fmt.Fprintln(stderr, "rolter up: -pd must start at most 64 engines")
		return 2
	}
	log := newLogger(stderr, o.logLevel)

	var sims []*sim.Engine
	defer func() {
		for _, e := range sims {
			e.Stop()
		}
	}()
	roles := o.pd.roles(o.n)
	for i, role := range roles {
		e, err := startUpSim(&o, i, role)
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
	var text string
	if o.pd.set() {
		text = upPDConfig(ln.Addr().String(), o.strategy, o.shadow, sims[:o.pd.prefill], sims[o.pd.prefill:])
	} else {
		text = upConfig(ln.Addr().String(), o.strategy, o.shadow, sims)
	}
	path := o.configOut
	if path == "" {
		path = filepath.Join(os.TempDir(), fmt.Sprintf("rolter-up-%d.toml", os.Getpid()))
	}
	var token string
	if o.control {
		token = rand.Text()
		os.Setenv(upTokenEnv, token)
		store := strings.TrimSuffix(path, ".toml") + ".db"
		defer removeStore(store)
		text += upControlConfig(freeOr(o.controlListen), store)
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
	run := cfg
	var cp *controlPlane
	if o.control {
		if cp, run, err = openControl(cfg, log); err != nil {
			fmt.Fprintf(stderr, "rolter up: cannot open the control plane: %s\n", err)
			return 1
		}
		defer cp.stop()
	}
	fg, err := newGateway(run, log)
	if err != nil {
		fmt.Fprintf(stderr, "rolter up: cannot start the gateway: %s\n", err)
		return 1
	}
	defer fg.close()
	g := fg.g
	reload := func() { fg.reloadFile(path) }
	if cp != nil {
		if err := cp.start(fg); err != nil {
			fmt.Fprintf(stderr, "rolter up: cannot start the control plane: %s\n", err)
			return 1
		}
		reload = func() { cp.reload(g, path) }
	}

	url := "http://" + ln.Addr().String()
	if o.pd.set() {
		if err := printPDBanner(stdout, url, path, &o, sims, cp, token); err != nil {
			fmt.Fprintf(stderr, "rolter up: %s\n", err)
			return 1
		}
	} else {
		printBanner(stdout, url, path, &o, sims, cp, token)
	}

	code := serveUntilSignal(g, ln, 5*time.Second, reload, log)
	fmt.Fprintln(stdout, "stopped.")
	return code
}

// printBanner prints where an aggregated `rolter up` serves and a request to try.
func printBanner(stdout io.Writer, url, path string, o *upOptions, sims []*sim.Engine, cp *controlPlane, token string) {
	model := sims[0].Config().Model
	fmt.Fprintf(stdout, "\nRolter %s is up: %d simulated vLLM engines behind one gateway (strategy %s).\n\n", version, o.n, o.strategy)
	fmt.Fprintf(stdout, "  gateway   %s/v1   (OpenAI-compatible; model %q)\n", url, model)
	fmt.Fprintf(stdout, "  metrics   %s/metrics\n", url)
	printControl(stdout, cp, token)
	fmt.Fprintf(stdout, "  config    %s\n", path)
	for i, e := range sims {
		fmt.Fprintf(stdout, "  engine %-2d %s\n", i+1, e.URL())
	}
	fmt.Fprintf(stdout, "\nTry it (send it twice: the second lands on the same engine, its prompt cached, usage.prompt_tokens_details.cached_tokens > 0):\n\n")
	fmt.Fprintf(stdout, "  curl -s %s/v1/chat/completions -H 'Content-Type: application/json' -D - \\\n", url)
	fmt.Fprintf(stdout, "    -d '{\"model\":%q,\"messages\":[{\"role\":\"user\",\"content\":%q}]}'\n\n", model, TryItPrompt)
	fmt.Fprintf(stdout, "Ctrl-C stops everything.\n")
}

// printControl prints the control plane's addresses of `rolter up -control`.
func printControl(stdout io.Writer, cp *controlPlane, token string) {
	if cp == nil {
		return
	}
	ctl := "http://" + cp.ln.Addr().String()
	fmt.Fprintf(stdout, "  dashboard %s/dashboard/   (admin token %s)\n", ctl, token)
	fmt.Fprintf(stdout, "  api       %s/api/v1   (Authorization: Bearer $%s)\n", ctl, upTokenEnv)
}

// startUpSim starts engine i of `rolter up` in role.
func startUpSim(o *upOptions, i int, role sim.Role) (*sim.Engine, error) {
	cfg := sim.DefaultConfig()
	cfg.KVEvents = "tcp://127.0.0.1:*"
	cfg.Replay = "tcp://127.0.0.1:*"
	cfg.EngineLabel = fmt.Sprint(i)
	cfg.NumBlocks = o.numBlocks
	cfg.MaxNumSeqs = o.maxNumSeqs
	cfg.PrefillPerToken = time.Duration(o.prefillUs * float64(time.Microsecond))
	cfg.DecodePerToken = time.Duration(o.decodeUs * float64(time.Microsecond))
	if role != sim.RoleAggregated {
		// Each prefill engine serves its block pulls on a free loopback port of its own.
		cfg.Role, cfg.SideChannelPort, cfg.SideChannelHost = role, 0, "127.0.0.1"
	}
	if !kvindex.Supported || role == sim.RoleDecode {
		// A decode engine's cache is not what routes a request (its pool is chosen by load).
		cfg.KVEvents, cfg.Replay = "", ""
	}
	e, err := sim.New(cfg)
	if err == nil {
		err = e.Start()
	}
	return e, err
}

// TryItPrompt is the prompt `rolter up` suggests: longer than one KV block of the simulator (16 tokens), so
// that the second send finds whole blocks cached.
const TryItPrompt = "You are a concise assistant for a team that runs vLLM fleets. In two sentences, explain why " +
	"sending a request to the replica that already holds its prompt prefix in its KV cache cuts the time to first token."

// upTokenEnv is the variable `rolter up -control` keeps its generated admin token in, for the control plane
// to read as [control] admin_token_env.
const upTokenEnv = "ROLTER_UP_ADMIN_TOKEN"

// freeOr returns addr if it can be listened on now, else a free port on loopback.
func freeOr(addr string) string {
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		return addr
	}
	return "127.0.0.1:0"
}

// upControlConfig is the [control] section of `rolter up -control`: a SQLite store beside the config.
func upControlConfig(listen, store string) string {
	return fmt.Sprintf("\n[control]\nenabled = true\nlisten = %q\nstore = %q\nadmin_token_env = %q\n", listen, store, upTokenEnv)
}

// removeStore removes a SQLite store and its journal files.
func removeStore(path string) {
	for _, suffix := range []string{"", "-wal", "-shm", "-journal"} {
		os.Remove(path + suffix)
	}
}

// shadowOf returns the -shadow list without the route's own strategy, which cannot shadow itself; it says
// so on stderr when it leaves one out.
func shadowOf(strategy, shadow string, stderr io.Writer) string {
	if shadow == "" {
		return ""
	}
	var keep []string
	for _, n := range strings.Split(shadow, ",") {
		n = strings.TrimSpace(n)
		if n == strategy {
			fmt.Fprintf(stderr, "rolter up: -shadow %s left out: it is the route's strategy (-strategy)\n", n)
			continue
		}
		keep = append(keep, n)
	}
	return strings.Join(keep, ",")
}

// upSections are the sections of every config `rolter up` generates: health checks and engine-metrics
// scraping on.
const upSections = "[health]\nenabled = true\ninterval_secs = 1\n\n[metrics_scrape]\nenabled = true\ninterval_secs = 0.25\n\n"

// writeUpProvider writes the provider of simulated engine e, its KV events (and replay) wired when it
// publishes them.
func writeUpProvider(b *strings.Builder, name string, e *sim.Engine) {
	fmt.Fprintf(b, "[[providers]]\nname = %q\napi_base = %q\n", name, e.URL())
	if ep := e.KVEventsEndpoint(); ep != "" {
		fmt.Fprintf(b, "[providers.kv_events]\nendpoint = %q\n", ep)
		if rep := e.ReplayEndpoint(); rep != "" {
			fmt.Fprintf(b, "replay_endpoint = %q\n", rep)
		}
	}
	b.WriteString("\n")
}

// upConfig renders the config of `rolter up`: one route over every engine, health checks and engine-metrics
// scraping on, KV events wired (used by precise_cache_aware).
func upConfig(listen, strategy, shadow string, sims []*sim.Engine) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Generated by `rolter up`: %d simulated vLLM engines behind one route.\n", len(sims))
	fmt.Fprintf(&b, "[server]\nlisten = %q\n\n", listen)
	b.WriteString(upSections)
	for i, e := range sims {
		writeUpProvider(&b, fmt.Sprintf("sim-%d", i+1), e)
	}
	fmt.Fprintf(&b, "[[routes]]\nmodel = %q\nstrategy = %q\n", sims[0].Config().Model, strategy)
	for i := range sims {
		fmt.Fprintf(&b, "\n[[routes.targets]]\nprovider = \"sim-%d\"\n", i+1)
	}
	writeShadow(&b, shadow)
	return b.String()
}

// writeShadow renders the route's [routes.shadow] section, if any.
func writeShadow(b *strings.Builder, shadow string) {
	if shadow == "" {
		return
	}
	var names []string
	for _, n := range strings.Split(shadow, ",") {
		names = append(names, strconv.Quote(strings.TrimSpace(n)))
	}
	fmt.Fprintf(b, "\n[routes.shadow]\nstrategies = [%s]\n", strings.Join(names, ", "))
}
