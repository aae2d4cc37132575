package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/capture"
	"github.com/rolter-ai/rolter/loadtest"
	"github.com/rolter-ai/rolter/sim"
)

// Options configure a replay of a trace through every strategy on a simulated fleet
// (`rolter replay`). Zero values take the defaults named; the engine knobs default to the routing
// report's, except the KV blocks, which default to the sim's.
type Options struct {
	// Engines is the fleet size (8).
	Engines int
	// Strategies to run, in order (fleet.Strategies).
	Strategies []string
	// KVBlocks per engine (2048) and BlockSize in tokens (16): the cache each engine has. Requests
	// longer than KVBlocks × BlockSize (prompt + output) cannot run on an engine and are skipped.
	KVBlocks  int
	BlockSize int
	// MaxNumSeqs per engine (4).
	MaxNumSeqs int
	// PrefillPerToken (100µs) and DecodePerToken (1ms), as in the routing report.
	PrefillPerToken time.Duration
	DecodePerToken  time.Duration
	// Speed > 0 replays at the trace's arrival times ÷ Speed (open loop, at most Concurrency in
	// flight); 0 sends the requests in trace order, closed loop with Concurrency in flight.
	Speed float64
	// Concurrency is the closed-loop in-flight count (Engines × MaxNumSeqs × 3/4), or the most in
	// flight of a timed replay (512).
	Concurrency int
	// Scale divides every token count of the trace (1); see PlanOptions.
	Scale int
	// MaxRequests replayed (5000).
	MaxRequests int
	// Timeout bounds the whole replay (20m): each strategy gets an equal share of what is left
	// when it starts; requests still in flight at the end of its share are cancelled and counted.
	Timeout time.Duration
	// IncludeUnanswered replays capture lines whose client got no 2xx.
	IncludeUnanswered bool
	// NoContinuation keeps a session's partial last blocks distinct (PlanOptions.NoContinuation).
	NoContinuation bool
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

func (o *Options) normalize() {
	if o.Engines == 0 {
		o.Engines = 8
	}
	if o.Strategies == nil {
		o.Strategies = fleet.Strategies
	}
	if o.KVBlocks == 0 {
		o.KVBlocks = sim.DefaultConfig().NumBlocks
	}
	if o.BlockSize == 0 {
		o.BlockSize = sim.DefaultConfig().BlockSize
	}
	if o.MaxNumSeqs == 0 {
		o.MaxNumSeqs = 4
	}
	if o.PrefillPerToken == 0 {
		o.PrefillPerToken = 100 * time.Microsecond
	}
	if o.DecodePerToken == 0 {
		o.DecodePerToken = time.Millisecond
	}
	if o.Concurrency == 0 {
		o.Concurrency = max(1, o.Engines*o.MaxNumSeqs*3/4)
		if o.Speed > 0 {
			o.Concurrency = 512
		}
	}
	if o.Scale == 0 {
		o.Scale = 1
	}
	if o.MaxRequests == 0 {
		o.MaxRequests = 5000
	}
	if o.Timeout == 0 {
		o.Timeout = 20 * time.Minute
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
}

func (o *Options) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if o.Engines < 1 || o.Engines > 64 {
		bad("engines %d out of range 1..64", o.Engines)
	}
	if len(o.Strategies) == 0 {
		bad("no strategy to run")
	}
	if o.KVBlocks < 1 || o.BlockSize < 1 || o.BlockSize > 1024 || o.MaxNumSeqs < 1 {
		bad("kv blocks %d, block size %d (1..1024) and max num seqs %d must be positive", o.KVBlocks, o.BlockSize, o.MaxNumSeqs)
	}
	if o.PrefillPerToken < 0 || o.DecodePerToken < 0 {
		bad("prefill and decode times must not be negative")
	}
	if !(o.Speed >= 0) || math.IsInf(o.Speed, 0) {
		bad("speed %v must be a number >= 0", o.Speed)
	}
	if o.Concurrency < 1 || o.Concurrency > 4096 {
		bad("concurrency %d out of range 1..4096", o.Concurrency)
	}
	if o.Scale < 1 {
		bad("scale %d must be >= 1", o.Scale)
	}
	if o.MaxRequests < 1 {
		bad("max requests %d must be >= 1", o.MaxRequests)
	}
	if n := time.Duration(max(len(o.Strategies), 1)); o.Timeout < n*minRunTime {
		bad("timeout %s too short for %d strategies: at least %s each", o.Timeout, n, minRunTime)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cannot replay: %w", err)
	}
	return nil
}

func (o *Options) simConfig() sim.Config {
	c := sim.DefaultConfig()
	c.NumBlocks = o.KVBlocks
	c.BlockSize = o.BlockSize
	c.MaxNumSeqs = o.MaxNumSeqs
	c.PrefillPerToken = o.PrefillPerToken
	c.DecodePerToken = o.DecodePerToken
	return c
}

// Report is the result of a replay: the trace, the fleet, and one run per strategy.
type Report struct {
	// Trace is the file's name as given (informational), Format its format.
	Trace  string    `json:"trace"`
	Format string    `json:"format"`
	Plan   PlanStats `json:"plan"`
	// Truncated: the file held more requests than were read.
	Truncated bool          `json:"truncated"`
	Options   ReportOptions `json:"options"`
	Oracle    Oracle        `json:"oracle"`
	Runs      []*Result     `json:"runs"`
	Started   time.Time     `json:"started"`
	Seconds   float64       `json:"seconds"`
	Machine   fleet.Machine `json:"machine"`

	plan    *loadtest.Plan               // for tests
	samples map[string][]loadtest.Sample // per strategy, for tests (runTrace with keepSamples)
}

// ReportOptions is the serialisable part of Options, defaults filled in.
type ReportOptions struct {
	Engines         int      `json:"engines"`
	Strategies      []string `json:"strategies"`
	KVBlocks        int      `json:"kv_blocks"`
	BlockSize       int      `json:"block_size"`
	MaxNumSeqs      int      `json:"max_num_seqs"`
	PrefillPerToken string   `json:"prefill_per_token"`
	DecodePerToken  string   `json:"decode_per_token"`
	Speed           float64  `json:"speed"`
	Concurrency     int      `json:"concurrency"`
	Scale           int      `json:"scale"`
	MaxRequests     int      `json:"max_requests"`
	Timeout         string   `json:"timeout"`
}

// Oracle holds the bounds of the replayed prompts (from the first run that measured them;
// every run sends the same prompts).
type Oracle struct {
	// HitRate is the unlimited fleet-wide cache's (loadtest.Oracle): no routing can beat it.
	HitRate float64 `json:"hit_rate"`
	// CapacityHitRate is one pooled LRU cache of the fleet's KV blocks (loadtest.CapacityOracle):
	// an estimate of what capacity allows.
	CapacityHitRate float64 `json:"capacity_hit_rate"`
	CapacityBlocks  int     `json:"capacity_blocks"`
	// Blocks and Reused are the distinct full KV blocks of the replayed prompts and those a later
	// prompt hits (the working set worth caching).
	Blocks int `json:"blocks"`
	Reused int `json:"reused_blocks"`
}

// Result is one strategy's replay.
type Result struct {
	Strategy string `json:"strategy"`
	// Unavailable is set ("not available in this build: ...") when the strategy could not run;
	// Error when the run failed for another reason.
	Unavailable string `json:"unavailable,omitempty"`
	Error       string `json:"error,omitempty"`
	// Requests planned, sent, answered, failed, and cancelled by the time bound (in flight at
	// its end; those never sent are Planned − Sent).
	Planned   int `json:"planned"`
	Sent      int `json:"sent"`
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	Cancelled int `json:"cancelled"`
	// Engine-side counters summed over the fleet: prompt tokens looked up and found cached.
	PromptTokens uint64 `json:"engine_prompt_tokens"`
	CachedTokens uint64 `json:"engine_cached_tokens"`
	// HitRate is CachedTokens / PromptTokens: the engines' own usage.
	HitRate float64 `json:"token_hit_rate"`
	// VsOracle and VsCapacityOracle are HitRate over this run's oracle bounds.
	OracleHitRate         float64 `json:"oracle_hit_rate"`
	CapacityOracleHitRate float64 `json:"capacity_oracle_hit_rate"`
	VsOracle              float64 `json:"hit_rate_vs_oracle"`
	VsCapacityOracle      float64 `json:"hit_rate_vs_capacity_oracle"`
	// TTFT of the requests that succeeded, ms.
	TTFT loadtest.Dist `json:"ttft_ms"`
	// EngineRequests is the requests each engine received; BusiestIdlest max/min of them (-1 when
	// an engine got none), CoV their coefficient of variation (standard deviation / mean).
	EngineRequests []int   `json:"engine_requests"`
	BusiestIdlest  float64 `json:"busiest_idlest"`
	CoV            float64 `json:"cov"`
	// Decisions are the x-rolter-decision counts.
	Decisions map[string]int `json:"decisions,omitempty"`
	Evictions uint64         `json:"engine_evictions"`
	// WallSeconds is the first request's start to the last one's end; Seconds the whole run,
	// fleet start to stop.
	WallSeconds float64 `json:"wall_seconds"`
	Seconds     float64 `json:"seconds"`
}

// Available reports whether the run measured something.
func (r *Result) Available() bool { return r.Unavailable == "" && r.Error == "" }

// Run replays tr through every strategy of o, each on a fresh fleet (cold caches), and returns
// the report. name is the trace's file name, for the report only. It returns an error when the
// options are bad or the trace has nothing to replay, and ctx's error with a partial report when
// ctx ends; a strategy that cannot run is recorded in its run.
func Run(ctx context.Context, name string, tr *capture.Trace, o Options) (*Report, error) {
	return runTrace(ctx, name, tr, o, false)
}

// runTrace is Run; keepSamples keeps each strategy's samples in the report (the tests compare them).
func runTrace(ctx context.Context, name string, tr *capture.Trace, o Options, keepSamples bool) (*Report, error) {
	o.normalize()
	if err := o.validate(); err != nil {
		return nil, err
	}
	sc := o.simConfig()
	plan, stats, err := TracePlan(tr, PlanOptions{
		Scale: o.Scale, Speed: o.Speed, MaxModelLen: sc.NumBlocks * sc.BlockSize, MaxRequests: o.MaxRequests,
		IncludeUnanswered: o.IncludeUnanswered, NoContinuation: o.NoContinuation,
	})
	if err != nil {
		return nil, err
	}
	rep := &Report{
		Trace: name, Format: tr.Format, Plan: stats, Truncated: tr.Truncated,
		Options: ReportOptions{
			Engines: o.Engines, Strategies: o.Strategies, KVBlocks: o.KVBlocks, BlockSize: o.BlockSize,
			MaxNumSeqs: o.MaxNumSeqs, PrefillPerToken: o.PrefillPerToken.String(), DecodePerToken: o.DecodePerToken.String(),
			Speed: o.Speed, Concurrency: o.Concurrency, Scale: o.Scale, MaxRequests: o.MaxRequests, Timeout: o.Timeout.String(),
		},
		Started: time.Now(),
		Machine: fleet.DescribeMachine(),
		plan:    plan,
	}
	if keepSamples {
		rep.samples = map[string][]loadtest.Sample{}
	}
	fmt.Fprintf(o.Log, "replay: %d of %d requests of %s (%s), %d distinct blocks of %.1f tokens, %d sessions\n",
		stats.Planned, stats.Read, name, tr.Format, stats.Blocks, stats.BlockTokens, stats.Sessions)
	log := slog.New(slog.NewTextHandler(o.Log, &slog.HandlerOptions{Level: slog.LevelError}))
	deadline := rep.Started.Add(o.Timeout)
	for i, strategy := range o.Strategies {
		if err := ctx.Err(); err != nil {
			break
		}
		share := time.Until(deadline) / time.Duration(len(o.Strategies)-i)
		run, res := runOne(ctx, &o, sc, plan, strategy, share, log)
		rep.Runs = append(rep.Runs, run)
		switch {
		case run.Unavailable != "":
			fmt.Fprintf(o.Log, "replay: %-19s %s\n", strategy, run.Unavailable)
		case run.Error != "":
			fmt.Fprintf(o.Log, "replay: %-19s error: %s\n", strategy, run.Error)
		default:
			fmt.Fprintf(o.Log, "replay: %-19s hit %.3f (oracle %.3f) ttft p50 %.0fms p99 %.0fms busiest/idlest %s failed %d cancelled %d (%.0fs)\n",
				strategy, run.HitRate, run.OracleHitRate, run.TTFT.P50, run.TTFT.P99, loadtest.FormatMaxMin(run.BusiestIdlest),
				run.Failed, run.Cancelled, run.Seconds)
			if rep.Oracle.CapacityBlocks == 0 {
				rep.Oracle = Oracle{HitRate: res.OracleHitRate, CapacityHitRate: res.CapacityOracleHitRate,
					CapacityBlocks: res.CapacityOracleBlocks, Blocks: res.OracleBlocks, Reused: res.OracleReused}
			}
			if keepSamples {
				rep.samples[strategy] = res.Samples
			}
		}
	}
	rep.Seconds = time.Since(rep.Started).Seconds()
	return rep, ctx.Err()
}

// minRunTime is the least share of the timeout a strategy may get: the requests' time and the
// fleet's start and stop (stopMargin).
const (
	minRunTime = 3 * time.Second
	stopMargin = time.Second
)

// runOne replays plan under one strategy on a fresh fleet within share.
func runOne(ctx context.Context, o *Options, sc sim.Config, plan *loadtest.Plan, strategy string, share time.Duration,
	log *slog.Logger) (*Result, *loadtest.Result) {
	run := &Result{Strategy: strategy}
	start := time.Now()
	defer func() { run.Seconds = time.Since(start).Seconds() }()
	f, err := fleet.Start(o.Engines, sc, strategy, log)
	if err != nil {
		var ue *fleet.UnavailableError
		if errors.As(err, &ue) {
			run.Unavailable = "not available in this build: " + ue.Reason
		} else {
			run.Error = err.Error()
		}
		return run, nil
	}
	defer f.Stop()
	precise := strategy == "precise_cache_aware"
	if precise {
		// As in the routing report: let the subscribers connect before the first event.
		time.Sleep(500 * time.Millisecond)
	}
	// Leave time to stop the fleet within the share.
	duration := share - time.Since(start) - stopMargin
	if duration < time.Second {
		run.Error = fmt.Sprintf("no time left within the timeout (share %s)", share.Round(time.Millisecond))
		return run, nil
	}
	res, err := loadtest.Run(ctx, loadtest.Options{
		URL:            f.URL,
		Plan:           plan,
		Concurrency:    o.Concurrency,
		Duration:       duration,
		Timeout:        duration,
		TokenIDs:       precise,
		TokenizeURL:    f.Sims[0].URL(),
		Targets:        f.Names,
		BlockSize:      sc.BlockSize,
		OracleCapacity: o.Engines * sc.NumBlocks,
		KeepSamples:    true,
	})
	if err != nil {
		run.Error = err.Error()
		return run, nil
	}
	run.Planned, run.Sent, run.Succeeded, run.Failed, run.Cancelled = res.Planned, res.Sent, res.Succeeded, res.Failed, res.Cancelled
	run.TTFT, run.Decisions, run.WallSeconds = res.TTFT, res.Decisions, res.WallSeconds
	run.OracleHitRate, run.CapacityOracleHitRate = res.OracleHitRate, res.CapacityOracleHitRate
	for _, e := range f.Sims {
		st := e.Stats()
		run.PromptTokens += st.QueriedTokens
		run.CachedTokens += st.HitTokens
		run.Evictions += st.Evictions
		run.EngineRequests = append(run.EngineRequests, int(st.Requests))
	}
	if run.PromptTokens > 0 {
		run.HitRate = float64(run.CachedTokens) / float64(run.PromptTokens)
	}
	if run.OracleHitRate > 0 {
		run.VsOracle = run.HitRate / run.OracleHitRate
	}
	if run.CapacityOracleHitRate > 0 {
		run.VsCapacityOracle = run.HitRate / run.CapacityOracleHitRate
	}
	run.BusiestIdlest, run.CoV = fleet.Spread(run.EngineRequests)
	return run, res
}
