package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/engine"
	"github.com/rolter-ai/rolter/kvindex"
	"github.com/rolter-ai/rolter/sim"
)

// UnavailableError says a strategy cannot run in this build: the gateway rejected it as an
// unknown strategy, or it needs KV events and the build has no cgo.
type UnavailableError struct {
	Strategy string
	Reason   string
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("strategy %q is not available in this build: %s", e.Strategy, e.Reason)
}

// Fleet is N in-process simulated engines behind one in-process gateway on loopback.
type Fleet struct {
	Sims []*sim.Engine
	// Prefill is how many of Sims, first in order, are the prefill pool of a disaggregated fleet
	// (StartDisagg); 0 for an aggregated one.
	Prefill int
	Names   []string
	Gateway *engine.Gateway
	served  chan error
	URL     string
}

// Start starts n engines with simCfg (each its own engine label and KV event socket when
// cgo allows) and a gateway whose one route uses strategy. On any error everything started is
// stopped again. A strategy the config rejects as unknown, or one needing KV events in a build
// without them, gives an *UnavailableError. extra is appended to the gateway's config (e.g. [trace]).
func Start(n int, simCfg sim.Config, strategy string, log *slog.Logger, extra ...string) (*Fleet, error) {
	// Check the strategy before starting anything: a config naming n placeholder engines fails
	// the same way the real one would.
	if err := CheckStrategy(n, strategy); err != nil {
		return nil, err
	}
	f := &Fleet{}
	ok := false
	defer func() {
		if !ok {
			f.Stop()
		}
	}()
	for i := 0; i < n; i++ {
		c := simCfg
		c.EngineLabel = fmt.Sprint(i)
		c.Port = 0
		if kvindex.Supported {
			c.KVEvents = "tcp://127.0.0.1:*"
		}
		e, err := sim.New(c)
		if err != nil {
			return nil, fmt.Errorf("cannot configure simulated engine %d: %w", i+1, err)
		}
		if err := e.Start(); err != nil {
			return nil, fmt.Errorf("cannot start simulated engine %d: %w", i+1, err)
		}
		f.Sims = append(f.Sims, e)
		f.Names = append(f.Names, fmt.Sprintf("sim-%d", i+1))
		// Wait until it serves: stopping an engine whose server has not started serving yet
		// would race with fasthttp's Serve.
		if err := WaitHTTP(context.Background(), e.URL()+"/health", 10*time.Second, nil); err != nil {
			return nil, fmt.Errorf("simulated engine %d does not answer: %w", i+1, err)
		}
	}
	if err := f.startGateway(func(listen string) string {
		return Config(listen, strategy, f.URLs(), f.kvEndpoints(), f.Sims[0].Config().Model) + strings.Join(extra, "")
	}, log); err != nil {
		return nil, err
	}
	ok = true
	return f, nil
}

// startGateway starts the fleet's in-process gateway on a loopback port with the config render makes for
// that address, and waits until it answers.
func (f *Fleet) startGateway(render func(listen string) string, log *slog.Logger) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("cannot listen on loopback: %w", err)
	}
	text := render(ln.Addr().String())
	cfg, err := config.Parse([]byte(text), "bench.toml")
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("cannot parse the generated gateway config: %w\n%s", err, text)
	}
	g, err := engine.New(cfg, engine.Options{Logger: log, Version: "bench"})
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("cannot start the gateway: %w", err)
	}
	f.Gateway = g
	f.served = make(chan error, 1)
	go func() { f.served <- g.Serve(ln) }()
	f.URL = "http://" + ln.Addr().String()
	if err := WaitHTTP(context.Background(), f.URL+"/healthz", 10*time.Second, nil); err != nil {
		return fmt.Errorf("the gateway does not answer: %w", err)
	}
	return nil
}

// CheckStrategy parses the fleet config of strategy over n placeholder engines and maps a
// rejected strategy to an *UnavailableError.
func CheckStrategy(n int, strategy string) error {
	urls := make([]string, n)
	kv := make([]string, n)
	for i := range urls {
		urls[i] = fmt.Sprintf("http://127.0.0.1:%d", 1+i)
		if kvindex.Supported {
			kv[i] = fmt.Sprintf("tcp://127.0.0.1:%d", 1+i)
		}
	}
	_, err := config.Parse([]byte(Config("127.0.0.1:0", strategy, urls, kv, "sim-model")), "bench.toml")
	if err == nil {
		return nil
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "unknown strategy"):
		return &UnavailableError{Strategy: strategy, Reason: "the gateway rejects it as an unknown strategy"}
	case strings.Contains(msg, "needs [providers.kv_events]") || strings.Contains(msg, "CGO_ENABLED=0"):
		return &UnavailableError{Strategy: strategy, Reason: "it needs KV events, which need cgo and libzmq"}
	}
	return fmt.Errorf("cannot parse the generated gateway config: %w", err)
}

// URLs returns the engines' base URLs.
func (f *Fleet) URLs() []string {
	out := make([]string, len(f.Sims))
	for i, e := range f.Sims {
		out[i] = e.URL()
	}
	return out
}

func (f *Fleet) kvEndpoints() []string {
	out := make([]string, len(f.Sims))
	for i, e := range f.Sims {
		out[i] = e.KVEventsEndpoint()
	}
	return out
}

// Stop shuts the gateway down and stops every engine. It may be called on a partial fleet.
func (f *Fleet) Stop() {
	if f.Gateway != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = f.Gateway.Shutdown(ctx)
		cancel()
		select {
		case <-f.served:
		case <-time.After(5 * time.Second):
		}
		f.Gateway = nil
	}
	var wg sync.WaitGroup
	for _, e := range f.Sims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.Stop()
		}()
	}
	wg.Wait()
	f.Sims = nil
}

// Config renders the gateway config: the shape `rolter up` generates (cmd/rolter/up.go):
// one route over every engine with default strategy parameters, active health checks, engine
// /metrics scraping every 250ms, and every engine's KV event stream declared (only strategies
// that use it subscribe). kv[i] may be empty (no events). Headers may be 1 MiB: the token ids of a long
// prompt for precise_cache_aware (x-rolter-vllm-token-ids) exceed the default 64 KiB at about 11,000 tokens.
func Config(listen, strategy string, urls, kv []string, model string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[server]\nlisten = %q\nmax_header_bytes = 1048576\n\n", listen)
	b.WriteString("[health]\nenabled = true\ninterval_secs = 1\n\n[metrics_scrape]\nenabled = true\ninterval_secs = 0.25\n\n")
	for i, u := range urls {
		fmt.Fprintf(&b, "[[providers]]\nname = \"sim-%d\"\napi_base = %q\n", i+1, u)
		if kv[i] != "" {
			fmt.Fprintf(&b, "[providers.kv_events]\nendpoint = %q\n", kv[i])
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "[[routes]]\nmodel = %q\nstrategy = %q\n", model, strategy)
	for i := range urls {
		fmt.Fprintf(&b, "\n[[routes.targets]]\nprovider = \"sim-%d\"\n", i+1)
	}
	return b.String()
}

// Sampler samples every engine's running + waiting requests at a fixed interval.
type Sampler struct {
	sims     []*sim.Engine
	interval time.Duration
	stopc    chan struct{}
	done     chan struct{}

	mu      sync.Mutex
	samples [][]int
}

func StartSampler(sims []*sim.Engine, interval time.Duration) *Sampler {
	s := &Sampler{sims: sims, interval: interval, stopc: make(chan struct{}), done: make(chan struct{})}
	go s.loop()
	return s
}

func (s *Sampler) loop() {
	defer close(s.done)
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-s.stopc:
			return
		case <-t.C:
		}
		row := make([]int, len(s.sims))
		for i, e := range s.sims {
			st := e.Stats()
			row[i] = st.Running + st.Waiting
		}
		s.mu.Lock()
		s.samples = append(s.samples, row)
		s.mu.Unlock()
	}
}

// Stop ends sampling and returns the samples (one row per tick, one column per engine).
func (s *Sampler) Stop() [][]int {
	close(s.stopc)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples
}

// InflightSummary describes how requests spread over engines in time.
type InflightSummary struct {
	// Mean is each engine's mean in-flight (running + waiting) over the middle 80% of the run.
	Mean []float64 `json:"mean"`
	// MaxMin is max(Mean) / min(Mean); -1 when an engine's mean is 0.
	MaxMin float64 `json:"max_min"`
	// Idle counts engines that were empty in more than half of the middle-window samples.
	Idle    int `json:"idle_engines"`
	Samples int `json:"samples"`
}

// SummarizeInflight reduces samples to per-engine means over the middle 80% of the samples
// (ramp-up and the drain at the end say nothing about steady routing).
func SummarizeInflight(samples [][]int, engines int) InflightSummary {
	lo, hi := len(samples)/10, len(samples)-len(samples)/10
	window := samples[lo:hi]
	out := InflightSummary{Mean: make([]float64, engines), Samples: len(window)}
	if len(window) == 0 {
		return out
	}
	empty := make([]int, engines)
	for _, row := range window {
		for i, v := range row {
			out.Mean[i] += float64(v)
			if v == 0 {
				empty[i]++
			}
		}
	}
	mn, mx := -1.0, 0.0
	for i := range out.Mean {
		out.Mean[i] /= float64(len(window))
		if mn < 0 || out.Mean[i] < mn {
			mn = out.Mean[i]
		}
		mx = max(mx, out.Mean[i])
		if 2*empty[i] > len(window) {
			out.Idle++
		}
	}
	if mn > 0 {
		out.MaxMin = mx / mn
	} else {
		out.MaxMin = -1
	}
	return out
}

// Strategies are the strategies the routing report compares, in report order.
var Strategies = []string{"round_robin", "least_load", "consistent_hash", "cache_aware", "pipeline", "precise_cache_aware"}
