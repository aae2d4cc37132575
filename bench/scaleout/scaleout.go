package scaleout

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/bench/routing"
	"github.com/rolter-ai/rolter/kvindex"
	"github.com/rolter-ai/rolter/loadtest"
	"github.com/rolter-ai/rolter/sim"
	"github.com/rolter-ai/rolter/telemetry"
)

// Strategies are the strategies the scale-out report compares, in report order. Two variants of
// cache_aware show what the many-gateway features buy: "cache_aware-local" turns the rendezvous home off
// (route parameter home = false: each replica on the evidence of its own requests alone, as before the
// features), and "cache_aware+cluster" adds the evidence and in-flight counts the replicas share over NATS
// ([cluster], a nats-server started for the cell). Plain "cache_aware" is the default parameters: the home,
// no NATS. "pipeline+cluster" is pipeline scoring the shared evidence too.
var Strategies = []string{"round_robin", "consistent_hash", "cache_aware-local", "cache_aware", "cache_aware+cluster", "pipeline", "pipeline+cluster", "precise_cache_aware"}

// GoalStrategy is the variant the scale-out goals are judged on: cache_aware with every
// many-gateway feature on.
const GoalStrategy = "cache_aware+cluster"

// scaleoutVariant splits a report strategy name into the route's strategy and the config the variant adds
// after the route: route parameters, [cluster]; cluster says the cell needs a nats-server.
func scaleoutVariant(name string) (strategy string, local, cluster bool) {
	if s, ok := strings.CutSuffix(name, "+cluster"); ok {
		return s, false, true
	}
	if s, ok := strings.CutSuffix(name, "-local"); ok {
		return s, true, false
	}
	return name, false, false
}

// Scenarios are the workloads of the scale-out report: the two whose affinity a replica can
// lose (a group's or a conversation's next request landing on a replica that never saw its prefix).
var Scenarios = []string{loadtest.SharedPrefix, loadtest.MultiTurn}

// Gateways are the gateway counts of the scale-out report.
var Gateways = []int{1, 2, 4}

// maxScaleoutGateways bounds the gateway processes one cell starts.
const maxScaleoutGateways = 16

// ErrNoHAProxy is returned by Run when no haproxy binary is found.
var ErrNoHAProxy = errors.New("haproxy not found (make bench-scaleout installs the Debian package)")

// Options configure the scale-out report. Zero values take the defaults named; the fleet, the
// scale and the load are the routing report's (routing.Options), so a 1-gateway row is comparable with it.
type Options struct {
	// Rolter is the gateway binary (bin/rolter); HAProxy the haproxy binary and NATSServer the
	// nats-server binary (default: looked up in PATH, then /usr/sbin).
	Rolter, HAProxy, NATSServer string
	// Gateways are the gateway counts to run (Gateways).
	Gateways []int
	// Engines is the fleet size (8).
	Engines int
	// Scale divides the unscaled shapes' token counts and the engines' KV blocks (4, routing.Options.Scale).
	Scale int
	// Strategies and Scenarios to run (Strategies, Scenarios).
	Strategies []string
	Scenarios  []string
	// Concurrency is the closed-loop in-flight count (Engines × MaxNumSeqs × 3/4 = 24), and so the
	// number of client connections HAProxy spreads over the gateways.
	Concurrency int
	// MaxNumSeqs per engine (4), PrefillPerToken (100µs), DecodePerToken (1ms): as routing.Options.
	MaxNumSeqs      int
	PrefillPerToken time.Duration
	DecodePerToken  time.Duration
	// Seed of the workloads (1); repeat r uses Seed + r in every cell.
	Seed uint64
	// Repeats of the whole matrix (3); tables show the repeat with the median token hit rate.
	Repeats int
	// RunTimeout bounds the load of one cell (2m).
	RunTimeout time.Duration
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// Workloads, when set, replace routing.Workload for the scenarios they name (tests use small ones).
	Workloads map[string]loadtest.Workload
}

// routing returns the routing report's options that share o's fleet, scale and load, defaults filled.
func (o *Options) routing() routing.Options {
	r := routing.Options{
		Engines: o.Engines, Scale: o.Scale, Strategies: o.Strategies, Scenarios: o.Scenarios,
		Concurrency: o.Concurrency, MaxNumSeqs: o.MaxNumSeqs, PrefillPerToken: o.PrefillPerToken,
		DecodePerToken: o.DecodePerToken, Seed: o.Seed, Repeats: o.Repeats, RunTimeout: o.RunTimeout,
		Workloads: o.Workloads, Log: o.Log,
	}
	r.Normalize()
	return r
}

func (o *Options) normalize() error {
	if o.Strategies == nil {
		o.Strategies = Strategies
	}
	if o.Scenarios == nil {
		o.Scenarios = Scenarios
	}
	if o.Gateways == nil {
		o.Gateways = Gateways
	}
	if o.RunTimeout == 0 {
		o.RunTimeout = 2 * time.Minute
	}
	r := o.routing()
	o.Engines, o.Scale, o.Concurrency, o.MaxNumSeqs = r.Engines, r.Scale, r.Concurrency, r.MaxNumSeqs
	o.PrefillPerToken, o.DecodePerToken, o.Seed, o.Repeats, o.Log = r.PrefillPerToken, r.DecodePerToken, r.Seed, r.Repeats, r.Log
	if o.HAProxy == "" {
		o.HAProxy = fleet.LookSbin("haproxy")
	}
	if o.NATSServer == "" {
		o.NATSServer = fleet.LookSbin("nats-server")
	}
	var errs []error
	if o.Rolter == "" {
		errs = append(errs, errors.New("missing the rolter binary (-rolter)"))
	}
	if o.HAProxy == "" {
		errs = append(errs, ErrNoHAProxy)
	}
	if len(o.Gateways) == 0 {
		errs = append(errs, errors.New("no gateway count"))
	}
	for _, n := range o.Gateways {
		if n < 1 || n > maxScaleoutGateways {
			errs = append(errs, fmt.Errorf("gateway count %d must be between 1 and %d", n, maxScaleoutGateways))
		}
	}
	if o.Repeats < 1 || o.Engines < 1 {
		errs = append(errs, errors.New("repeats and engines must be positive"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cannot run the scale-out report: %w", err)
	}
	return nil
}

// Trial is one cell of the matrix: a (scenario, strategy, gateway count) in one repeat.
type Trial struct {
	Scenario string `json:"scenario"`
	Strategy string `json:"strategy"`
	Gateways int    `json:"gateways"`
	Repeat   int    `json:"repeat"`
	Seed     uint64 `json:"seed"`
	// Unavailable is set ("not available in this build: ...") when the strategy could not run.
	Unavailable string `json:"unavailable,omitempty"`
	// Error is set when the cell failed for another reason.
	Error  string           `json:"error,omitempty"`
	Result *loadtest.Result `json:"result,omitempty"`
	// EngineRequests are the completion requests each engine received (its own counter), and
	// EngineCoV their coefficient of variation (population stddev / mean): the load spread.
	EngineRequests []int   `json:"engine_requests"`
	EngineCoV      float64 `json:"engine_cov"`
	// Inflight is each engine's mean running + waiting requests (sampled every 20 ms, middle 80% of
	// the run), and InflightCoV the CoV of those means.
	Inflight    fleet.InflightSummary `json:"inflight"`
	InflightCoV float64               `json:"inflight_cov"`
	// Per gateway, in HAProxy server order: what each one's /metrics counted over the run, and the TCP
	// connections HAProxy gave it (its stats socket, `stot`, minus the readiness probe's).
	GatewayRequests    []int     `json:"gateway_requests"`
	GatewayConnections []int     `json:"gateway_connections"`
	GatewayHitRate     []float64 `json:"gateway_hit_rate"`
	// GatewayKVEvents are the KV events each gateway's subscribers received (precise_cache_aware: every
	// gateway subscribes to every engine).
	GatewayKVEvents []int `json:"gateway_kv_events"`
	// GatewayKVTargets is, per gateway, the number of engines it received KV events from.
	GatewayKVTargets []int   `json:"gateway_kv_targets"`
	GroupsSplit      int     `json:"groups_split"`      // groups (users) served by more than one engine
	EnginesPerGroup  float64 `json:"engines_per_group"` // mean distinct engines per group (user)
	Seconds          float64 `json:"seconds"`           // the whole cell, processes included

	// pids of the processes the cell started (gateways, HAProxy), for the tests' cleanup check.
	pids []int
}

// Available reports whether the cell measured something.
func (r *Trial) Available() bool {
	return r.Unavailable == "" && r.Error == "" && r.Result != nil
}

// Report is the whole scale-out report.
type Report struct {
	Options   ReportOptions                `json:"options"`
	Workloads map[string]loadtest.Workload `json:"workloads"`
	Runs      []*Trial                     `json:"runs"`
	Goals     []fleet.Goal                 `json:"goals"`
	Versions  map[string]string            `json:"versions"`
	Started   time.Time                    `json:"started"`
	Seconds   float64                      `json:"seconds"`
	Machine   fleet.Machine                `json:"machine"`
}

// ReportOptions is the serialisable part of Options.
type ReportOptions struct {
	Gateways        []int    `json:"gateways"`
	Engines         int      `json:"engines"`
	Scale           int      `json:"scale"`
	Strategies      []string `json:"strategies"`
	Scenarios       []string `json:"scenarios"`
	Concurrency     int      `json:"concurrency"`
	MaxNumSeqs      int      `json:"max_num_seqs"`
	NumBlocks       int      `json:"num_blocks"`
	BlockSize       int      `json:"block_size"`
	PrefillPerToken string   `json:"prefill_per_token"`
	DecodePerToken  string   `json:"decode_per_token"`
	Seed            uint64   `json:"seed"`
	Repeats         int      `json:"repeats"`
	RunTimeout      string   `json:"run_timeout"`
}

// Run runs every (scenario, strategy, gateway count) cell Repeats times, each on a fresh fleet
// and fresh gateway processes, and evaluates the goals. A strategy the build lacks is recorded as
// unavailable and other failures of one cell in the cell; it returns an error when the options are
// unusable or ctx ends (with what was measured). Every process it starts is stopped before it returns.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.normalize(); err != nil {
		return nil, err
	}
	ro := o.routing()
	sc := ro.SimConfig()
	rep := &Report{
		Options: ReportOptions{
			Gateways: o.Gateways, Engines: o.Engines, Scale: o.Scale, Strategies: o.Strategies, Scenarios: o.Scenarios,
			Concurrency: o.Concurrency, MaxNumSeqs: o.MaxNumSeqs, NumBlocks: sc.NumBlocks, BlockSize: sc.BlockSize,
			PrefillPerToken: o.PrefillPerToken.String(), DecodePerToken: o.DecodePerToken.String(), Seed: o.Seed,
			Repeats: o.Repeats, RunTimeout: o.RunTimeout.String(),
		},
		Workloads: map[string]loadtest.Workload{},
		Versions:  map[string]string{},
		Started:   time.Now(),
		Machine:   fleet.DescribeMachine(),
	}
	if out, err := exec.Command(o.Rolter, "version").Output(); err == nil {
		rep.Versions["rolter"] = string(bytes.TrimSpace(out))
	}
	if out, err := exec.Command(o.HAProxy, "-v").Output(); err == nil {
		rep.Versions["haproxy"] = string(bytes.TrimSpace(bytes.SplitN(out, []byte("\n"), 2)[0]))
	}
	if o.NATSServer != "" {
		if out, err := exec.Command(o.NATSServer, "--version").Output(); err == nil {
			rep.Versions["nats-server"] = string(bytes.TrimSpace(out))
		}
	}
	dir, err := os.MkdirTemp("", "rolter-scaleout-")
	if err != nil {
		return nil, fmt.Errorf("cannot create a work directory: %w", err)
	}
	defer os.RemoveAll(dir)
	finish := func() {
		rep.Goals = goalsOf(rep)
		rep.Seconds = time.Since(rep.Started).Seconds()
	}
	// The whole matrix is repeated rather than each cell back to back, and the gateway count varies
	// fastest, so a slow spell of a shared machine lands on neighbouring cells that are compared.
	for repeat := 0; repeat < o.Repeats; repeat++ {
		for _, scenario := range o.Scenarios {
			rep.Workloads[scenario] = ro.Workload(scenario, 0)
			for _, strategy := range o.Strategies {
				for _, n := range o.Gateways {
					if err := ctx.Err(); err != nil {
						finish()
						return rep, err
					}
					run := scaleoutOne(ctx, &o, &ro, sc, dir, scenario, strategy, n, repeat)
					rep.Runs = append(rep.Runs, run)
					logScaleoutRun(o.Log, run)
				}
			}
		}
	}
	finish()
	return rep, ctx.Err()
}

func logScaleoutRun(w io.Writer, run *Trial) {
	head := fmt.Sprintf("scaleout: #%d %-13s %-19s %d gw", run.Repeat+1, run.Scenario, run.Strategy, run.Gateways)
	switch {
	case run.Unavailable != "":
		fmt.Fprintf(w, "%s %s\n", head, run.Unavailable)
	case run.Error != "":
		fmt.Fprintf(w, "%s error: %s\n", head, fleet.FirstLine(run.Error))
	default:
		r := run.Result
		fmt.Fprintf(w, "%s hit %.3f (oracle %.3f) ttft p50 %.0fms p90 %.0fms cov %.3f per gateway %s errors %d (%.0fs)\n",
			head, r.HitRate, r.OracleHitRate, r.TTFT.P50, r.TTFT.P90, run.EngineCoV, joinInts(run.GatewayRequests),
			r.Failed+r.Cancelled, run.Seconds)
	}
}

// scaleoutOne measures one cell on a fresh fleet and fresh gateways.
func scaleoutOne(ctx context.Context, o *Options, ro *routing.Options, sc sim.Config, dir, scenario, strategy string, n, repeat int) *Trial {
	w := ro.Workload(scenario, repeat)
	run := &Trial{Scenario: scenario, Strategy: strategy, Gateways: n, Repeat: repeat, Seed: w.Seed}
	start := time.Now()
	defer func() { run.Seconds = time.Since(start).Seconds() }()
	base, _, cluster := scaleoutVariant(strategy)
	if cluster && o.NATSServer == "" {
		run.Unavailable = "not available here: nats-server not found (make bench-scaleout installs the Debian package)"
		return run
	}
	if err := fleet.CheckStrategy(o.Engines, base); err != nil {
		var ue *fleet.UnavailableError
		if errors.As(err, &ue) {
			run.Unavailable = "not available in this build: " + ue.Reason
		} else {
			run.Error = err.Error()
		}
		return run
	}
	cellDir, err := os.MkdirTemp(dir, "cell-")
	if err != nil {
		run.Error = fmt.Sprintf("cannot create a work directory: %s", err)
		return run
	}
	defer os.RemoveAll(cellDir)
	c := &scaleoutCell{dir: cellDir}
	defer c.stop()
	err = c.start(ctx, o, sc, strategy, n)
	run.pids = c.pids()
	if err != nil {
		run.Error = err.Error()
		return run
	}
	precise := base == "precise_cache_aware"
	if precise {
		// Let every gateway's subscribers connect before the first event is published (ZMQ drops
		// messages for subscribers that have not joined yet).
		if err := sleepCtx(ctx, time.Second); err != nil {
			run.Error = err.Error()
			return run
		}
	}
	before, err := haproxySessions(c.statsSock, n)
	if err != nil {
		run.Error = err.Error()
		return run
	}
	sampler := fleet.StartSampler(c.sims, 20*time.Millisecond)
	res, err := loadtest.Run(ctx, loadtest.Options{
		URL:         c.URL,
		Workload:    w,
		Concurrency: o.Concurrency,
		Duration:    o.RunTimeout,
		Timeout:     time.Minute,
		TokenIDs:    precise,
		TokenizeURL: c.sims[0].URL(),
		Targets:     c.names,
		BlockSize:   sc.BlockSize,
		KeepSamples: true,
	})
	samples := sampler.Stop()
	if err != nil {
		run.Error = err.Error()
		return run
	}
	after, err := haproxySessions(c.statsSock, n)
	if err != nil {
		run.Error = err.Error()
		return run
	}
	for i := range after {
		run.GatewayConnections = append(run.GatewayConnections, after[i]-before[i])
	}
	for i, gw := range c.gwURLs {
		st, err := scrapeGateway(ctx, gw)
		if err != nil {
			run.Error = fmt.Sprintf("gateway %d: %s", i+1, err)
			return run
		}
		run.GatewayRequests = append(run.GatewayRequests, st.Requests)
		run.GatewayHitRate = append(run.GatewayHitRate, st.hitRate())
		run.GatewayKVEvents = append(run.GatewayKVEvents, st.KVEvents)
		run.GatewayKVTargets = append(run.GatewayKVTargets, st.KVTargets)
	}
	run.Inflight = fleet.SummarizeInflight(samples, len(c.sims))
	run.InflightCoV = cov(run.Inflight.Mean)
	var per []float64
	for _, e := range c.sims {
		r := int(e.Stats().Requests)
		run.EngineRequests = append(run.EngineRequests, r)
		per = append(per, float64(r))
	}
	run.EngineCoV = cov(per)
	run.GroupsSplit, run.EnginesPerGroup = fleet.GroupSpread(res.Samples)
	res.Samples = nil // the report keeps aggregates only
	run.Result = res
	return run
}

// scaleoutCell is the processes of one cell: in-process engines, gateway processes, HAProxy.
type scaleoutCell struct {
	dir       string
	sims      []*sim.Engine
	names     []string
	gws       []*fleet.Proc
	gwURLs    []string
	haproxy   *fleet.Proc
	nats      *fleet.Proc // the cell's nats-server, for the +cluster variant
	statsSock string
	URL       string // HAProxy's frontend
}

// start starts the engines, n gateways on the same config (each on its own port) and HAProxy in
// front of them, and waits until each answers. On error the caller still calls stop.
func (c *scaleoutCell) start(ctx context.Context, o *Options, sc sim.Config, strategy string, n int) error {
	for i := 0; i < o.Engines; i++ {
		cfg := sc
		cfg.EngineLabel = fmt.Sprint(i)
		cfg.Port = 0
		if kvindex.Supported {
			cfg.KVEvents = "tcp://127.0.0.1:*"
		}
		e, err := sim.New(cfg)
		if err != nil {
			return fmt.Errorf("cannot configure simulated engine %d: %w", i+1, err)
		}
		if err := e.Start(); err != nil {
			return fmt.Errorf("cannot start simulated engine %d: %w", i+1, err)
		}
		c.sims = append(c.sims, e)
		c.names = append(c.names, fmt.Sprintf("sim-%d", i+1))
		// Stopping an engine whose server has not started serving yet would race with fasthttp's Serve.
		if err := fleet.WaitHTTP(ctx, e.URL()+"/health", 10*time.Second, nil); err != nil {
			return fmt.Errorf("simulated engine %d does not answer: %w", i+1, err)
		}
	}
	urls := make([]string, len(c.sims))
	kv := make([]string, len(c.sims))
	for i, e := range c.sims {
		urls[i], kv[i] = e.URL(), e.KVEventsEndpoint()
	}
	base, local, cluster := scaleoutVariant(strategy)
	extra := ""
	if local {
		extra = "\n[routes.params]\nhome = false\n"
	}
	if cluster {
		url, err := c.startNATS(ctx, o.NATSServer)
		if err != nil {
			return err
		}
		extra = fmt.Sprintf("\n[cluster]\nnats_url = %q\n", url)
	}
	// Start every gateway before waiting for any: they boot side by side.
	for i := 0; i < n; i++ {
		port, err := fleet.FreePort()
		if err != nil {
			return err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		path := filepath.Join(c.dir, fmt.Sprintf("rolter-%d.toml", i+1))
		if err := os.WriteFile(path, []byte(scaleoutConfig(addr, base, urls, kv, sc.Model)+extra), 0o644); err != nil {
			return fmt.Errorf("cannot write %q: %w", path, err)
		}
		p, _, err := fleet.StartProc(fmt.Sprintf("rolter gateway %d", i+1), o.Rolter, []string{"serve", "-config", path, "-log-level", "warn"}, "", 0)
		if err != nil {
			return err
		}
		c.gws = append(c.gws, p)
		c.gwURLs = append(c.gwURLs, "http://"+addr)
	}
	for i, p := range c.gws {
		if err := fleet.WaitHTTP(ctx, c.gwURLs[i]+"/healthz", 15*time.Second, p); err != nil {
			return fmt.Errorf("gateway %d did not come up: %w", i+1, err)
		}
	}
	port, err := fleet.FreePort()
	if err != nil {
		return err
	}
	front := fmt.Sprintf("127.0.0.1:%d", port)
	c.statsSock = filepath.Join(c.dir, "haproxy.sock")
	hcfg := filepath.Join(c.dir, "haproxy.cfg")
	if err := os.WriteFile(hcfg, []byte(haproxyTCPConfig(front, c.gwURLs, filepath.Join(c.dir, "haproxy.pid"), c.statsSock)), 0o644); err != nil {
		return fmt.Errorf("cannot write %q: %w", hcfg, err)
	}
	// -db keeps it in the foreground: it is our child, stopped by its PID.
	hp, _, err := fleet.StartProc("haproxy", o.HAProxy, []string{"-f", hcfg, "-db"}, "", 0)
	if err != nil {
		return err
	}
	c.haproxy = hp
	c.URL = "http://" + front
	if err := fleet.WaitHTTP(ctx, c.URL+"/healthz", 15*time.Second, hp); err != nil {
		return fmt.Errorf("haproxy did not come up: %w", err)
	}
	return nil
}

// startNATS starts the cell's nats-server on loopback ports (client and monitoring) and returns its URL
// once its /healthz answers. Fresh for every cell: no evidence outlives its cell.
func (c *scaleoutCell) startNATS(ctx context.Context, bin string) (string, error) {
	port, err := fleet.FreePort()
	if err != nil {
		return "", err
	}
	mport, err := fleet.FreePort()
	if err != nil {
		return "", err
	}
	p, _, err := fleet.StartProc("nats-server", bin, []string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-m", strconv.Itoa(mport)}, "", 0)
	if err != nil {
		return "", err
	}
	c.nats = p
	if err := fleet.WaitHTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/healthz", mport), 15*time.Second, p); err != nil {
		return "", fmt.Errorf("nats-server did not come up: %w", err)
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", port), nil
}

// pids returns the PIDs of the processes started so far.
func (c *scaleoutCell) pids() []int {
	var out []int
	for _, p := range append([]*fleet.Proc{c.haproxy, c.nats}, c.gws...) {
		if p != nil && p.Started() {
			out = append(out, p.PID())
		}
	}
	return out
}

// stop ends HAProxy (so no connection holds a gateway's drain), then the gateways side by side, then
// the engines. It may be called on a partial cell and more than once.
func (c *scaleoutCell) stop() {
	c.haproxy.Stop()
	var wg sync.WaitGroup
	for _, p := range c.gws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Stop()
		}()
	}
	for _, e := range c.sims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.Stop()
		}()
	}
	wg.Wait()
	c.nats.Stop() // after the gateways: none of them logs a lost connection while it drains
	c.sims = nil
}

// scaleoutConfig is the gateway config of the routing report (fleet.Config: `rolter up`'s shape) with a
// short drain, so a stopped gateway exits at once.
func scaleoutConfig(listen, strategy string, urls, kv []string, model string) string {
	return strings.Replace(fleet.Config(listen, strategy, urls, kv, model), "[server]\n", "[server]\ndrain_secs = 2\n", 1)
}

// haproxyTCPConfig renders HAProxy as an L4 balancer over the gateways: mode tcp, round robin per
// connection, as a Kubernetes Service (kube-proxy) balances; the stats socket tells connections per server.
func haproxyTCPConfig(front string, gateways []string, pidfile, sock string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# scale-out report: an L4 balancer in front of the gateways
global
    maxconn 4096
    pidfile %s
    stats socket %s mode 600 level user

defaults
    mode tcp
    timeout connect 5s
    timeout client 5m
    timeout server 5m

frontend fe
    bind %s
    default_backend gateways

backend gateways
    balance roundrobin
`, pidfile, sock, front)
	for i, u := range gateways {
		fmt.Fprintf(&b, "    server gw%d %s\n", i+1, strings.TrimPrefix(u, "http://"))
	}
	return b.String()
}

// haproxySessions returns the connections HAProxy gave each server gw1..gwN so far (`stot` of `show stat`).
func haproxySessions(sock string, n int) ([]int, error) {
	conn, err := net.DialTimeout("unix", sock, 2*time.Second)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the haproxy stats socket: %w", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("show stat\n")); err != nil {
		return nil, fmt.Errorf("cannot query the haproxy stats socket: %w", err)
	}
	data, err := io.ReadAll(conn)
	if err != nil {
		return nil, fmt.Errorf("cannot read the haproxy stats: %w", err)
	}
	return parseHAProxySessions(data, n)
}

// parseHAProxySessions reads `stot` of the servers gw1..gwN of backend "gateways" from `show stat` CSV.
func parseHAProxySessions(data []byte, n int) ([]int, error) {
	r := csv.NewReader(bytes.NewReader(bytes.TrimPrefix(data, []byte("# "))))
	r.FieldsPerRecord = -1
	rows, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("cannot parse the haproxy stats: %w", err)
	}
	if len(rows) == 0 {
		return nil, errors.New("empty haproxy stats")
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	px, sv, stot := col["pxname"], col["svname"], col["stot"]
	if _, ok := col["stot"]; !ok {
		return nil, fmt.Errorf("no stot column in the haproxy stats header %q", strings.Join(rows[0], ","))
	}
	out := make([]int, n)
	found := 0
	for _, row := range rows[1:] {
		if len(row) <= max(px, sv, stot) || row[px] != "gateways" {
			continue
		}
		i, err := strconv.Atoi(strings.TrimPrefix(row[sv], "gw"))
		if err != nil || !strings.HasPrefix(row[sv], "gw") || i < 1 || i > n {
			continue
		}
		v, err := strconv.Atoi(row[stot])
		if err != nil {
			return nil, fmt.Errorf("cannot parse stot %q of %s: %w", row[stot], row[sv], err)
		}
		out[i-1] = v
		found++
	}
	if found != n {
		return nil, fmt.Errorf("haproxy stats list %d of %d gateways", found, n)
	}
	return out, nil
}

// gatewayStats is what one gateway's /metrics counted.
type gatewayStats struct {
	Requests     int // rolter_requests_total, every route, target and code
	PromptTokens float64
	CachedTokens float64
	KVEvents     int // rolter_kv_events_total, every target and kind
	KVTargets    int // targets with at least one KV event
}

func (s gatewayStats) hitRate() float64 {
	if s.PromptTokens == 0 {
		return 0
	}
	return s.CachedTokens / s.PromptTokens
}

// scrapeGateway reads a gateway's /metrics.
func scrapeGateway(ctx context.Context, base string) (gatewayStats, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return gatewayStats{}, fmt.Errorf("cannot scrape %q: %w", base, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return gatewayStats{}, fmt.Errorf("cannot scrape %q: %w", base, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return gatewayStats{}, fmt.Errorf("cannot read the metrics of %q: %w", base, err)
	}
	if resp.StatusCode != http.StatusOK {
		return gatewayStats{}, fmt.Errorf("cannot scrape %q: status %d", base, resp.StatusCode)
	}
	return parseGatewayMetrics(body), nil
}

// parseGatewayMetrics sums the counters the report reads from a gateway's exposition.
func parseGatewayMetrics(body []byte) gatewayStats {
	var st gatewayStats
	kvTargets := map[string]bool{}
	var sc telemetry.Scanner
	sc.Init(body)
	for sc.Next() {
		s := sc.Sample()
		switch string(s.Name) {
		case "rolter_requests_total":
			st.Requests += int(s.Value)
		case "rolter_prompt_tokens_total":
			st.PromptTokens += s.Value
		case "rolter_cached_tokens_total":
			st.CachedTokens += s.Value
		case "rolter_kv_events_total":
			st.KVEvents += int(s.Value)
			if t, ok := s.Label("target"); ok && s.Value > 0 {
				kvTargets[string(t)] = true
			}
		}
	}
	st.KVTargets = len(kvTargets)
	return st
}

// cov returns the coefficient of variation of vs (population stddev / mean), 0 for an empty or
// all-zero set.
func cov(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	mean := 0.0
	for _, v := range vs {
		mean += v
	}
	mean /= float64(len(vs))
	if mean == 0 {
		return 0
	}
	ss := 0.0
	for _, v := range vs {
		ss += (v - mean) * (v - mean)
	}
	return math.Sqrt(ss/float64(len(vs))) / mean
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func joinInts(v []int) string {
	if len(v) == 0 {
		return "-"
	}
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, " / ")
}

// Run returns the representative run of a cell: among the repeats that measured something, the one
// with the median token hit rate (the lower middle for an even count); else the first repeat (which
// says why it did not run); nil when none ran.
func (rep *Report) Run(scenario, strategy string, gateways int) *Trial {
	var first *Trial
	var ok []*Trial
	for _, run := range rep.cell(scenario, strategy, gateways) {
		if first == nil {
			first = run
		}
		if run.Available() {
			ok = append(ok, run)
		}
	}
	if len(ok) == 0 {
		return first
	}
	sort.SliceStable(ok, func(i, j int) bool { return ok[i].Result.HitRate < ok[j].Result.HitRate })
	return ok[(len(ok)-1)/2]
}

// cell returns every repeat of a cell, in run order.
func (rep *Report) cell(scenario, strategy string, gateways int) []*Trial {
	var out []*Trial
	for _, run := range rep.Runs {
		if run.Scenario == scenario && run.Strategy == strategy && run.Gateways == gateways {
			out = append(out, run)
		}
	}
	return out
}

// Median returns the median (lower middle), lowest and highest of f over the repeats of a cell that
// measured something, and their number.
func (rep *Report) Median(scenario, strategy string, gateways int, f func(*Trial) float64) (med, lo, hi float64, n int) {
	var vs []float64
	for _, run := range rep.cell(scenario, strategy, gateways) {
		if run.Available() {
			vs = append(vs, f(run))
		}
	}
	if len(vs) == 0 {
		return 0, 0, 0, 0
	}
	sort.Float64s(vs)
	return vs[(len(vs)-1)/2], vs[0], vs[len(vs)-1], len(vs)
}

func hitRateOf(r *Trial) float64   { return r.Result.HitRate }
func engineCoVOf(r *Trial) float64 { return r.EngineCoV }

// goalsOf evaluates the scale-out targets: with the most gateways, cache_aware loses at
// most 3 points of token hit rate against 1 gateway, and its engine load CoV stays within 0.1 of one
// gateway's, on both workloads.
func goalsOf(rep *Report) []fleet.Goal {
	const strategy = GoalStrategy
	most := 0
	for _, n := range rep.Options.Gateways {
		most = max(most, n)
	}
	hasOne := false
	for _, n := range rep.Options.Gateways {
		hasOne = hasOne || n == 1
	}
	var goals []fleet.Goal
	for _, scenario := range []string{loadtest.SharedPrefix, loadtest.MultiTurn} {
		gHit := fmt.Sprintf("%s token hit rate, %d gateways vs 1 (%s)", strategy, most, scenario)
		gCoV := fmt.Sprintf("%s engine load CoV (requests per engine), %d gateways vs 1 (%s)", strategy, most, scenario)
		const tHit, tCoV = "loses <= 3 points", "<= 1 gateway's + 0.1"
		na := func(why string) {
			goals = append(goals, fleet.Goal{Name: gHit, Target: tHit, Measured: why, Verdict: "n/a"},
				fleet.Goal{Name: gCoV, Target: tCoV, Measured: why, Verdict: "n/a"})
		}
		if !hasOne || most < 2 {
			na("needs runs with 1 gateway and with more")
			continue
		}
		one, many := rep.Run(scenario, strategy, 1), rep.Run(scenario, strategy, most)
		if why := unavailableWhy(one, "1 gateway"); why != "" {
			na(why)
			continue
		}
		if why := unavailableWhy(many, fmt.Sprintf("%d gateways", most)); why != "" {
			na(why)
			continue
		}
		h1, lo1, hi1, n1 := rep.Median(scenario, strategy, 1, hitRateOf)
		hN, loN, hiN, nN := rep.Median(scenario, strategy, most, hitRateOf)
		lost := (h1 - hN) * 100
		goals = append(goals, fleet.Goal{Name: gHit, Target: tHit,
			Measured: fmt.Sprintf("%.3f [%.3f–%.3f over %d runs] vs %.3f [%.3f–%.3f over %d runs]: %.1f points lost", hN, loN, hiN, nN, h1, lo1, hi1, n1, lost),
			Verdict:  fleet.Verdict(lost <= 3+1e-9)})
		c1, clo1, chi1, _ := rep.Median(scenario, strategy, 1, engineCoVOf)
		cN, cloN, chiN, _ := rep.Median(scenario, strategy, most, engineCoVOf)
		i1, _, _, _ := rep.Median(scenario, strategy, 1, func(r *Trial) float64 { return r.InflightCoV })
		iN, _, _, _ := rep.Median(scenario, strategy, most, func(r *Trial) float64 { return r.InflightCoV })
		goals = append(goals, fleet.Goal{Name: gCoV, Target: tCoV,
			Measured: fmt.Sprintf("%.3f [%.3f–%.3f] vs %.3f [%.3f–%.3f]: %+.3f (mean in-flight CoV %.3f vs %.3f)", cN, cloN, chiN, c1, clo1, chi1, cN-c1, iN, i1),
			Verdict:  fleet.Verdict(cN-c1 <= 0.1+1e-9)})
	}
	return goals
}

// unavailableWhy says why a representative run measured nothing, or "" when it did.
func unavailableWhy(r *Trial, what string) string {
	switch {
	case r == nil:
		return what + ": not run"
	case r.Unavailable != "":
		return what + ": " + r.Unavailable
	case r.Error != "":
		return what + " failed: " + fleet.FirstLine(r.Error)
	}
	return ""
}
