package routing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sort"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/loadtest"
	"github.com/rolter-ai/rolter/sim"
)

// Scenarios are the workloads of the routing report.
var Scenarios = []string{loadtest.SharedPrefix, loadtest.MultiTurn, loadtest.HotPrefix}

// Options configure the routing-quality report. Zero values take the defaults named.
type Options struct {
	// Engines is the fleet size (8).
	Engines int
	// Scale divides every token count and the engines' KV blocks of the unscaled shapes (4):
	// SGLang's GSP 64 groups × 16 prompts, 2,048/128/256 system/question/output tokens on engines of
	// 2,048 blocks becomes 512/32/64 tokens on 512 blocks, keeping the ratios (prefix : question :
	// output, working set : engine KV). Groups, prompts and users are not scaled.
	Scale int
	// Strategies and Scenarios to run (fleet.Strategies, Scenarios).
	Strategies []string
	Scenarios  []string
	// Concurrency is the closed-loop in-flight count (Engines × MaxNumSeqs × 3/4 = 24).
	Concurrency int
	// MaxNumSeqs per engine (4).
	MaxNumSeqs int
	// PrefillPerToken (100µs: a cold 544-token prompt takes 54ms, a hit on its 512-token prefix
	// 3ms, so prefill dominates TTFT) and DecodePerToken (1ms).
	PrefillPerToken time.Duration
	DecodePerToken  time.Duration
	// Seed of the workloads (1); repeat r uses Seed + r.
	Seed uint64
	// Repeats of every (scenario, strategy) run, each with its own seed and fresh fleet (3). The
	// tables show the repeat with the median token hit rate and the range over all of them.
	Repeats int
	// RunTimeout bounds one (scenario, strategy) run (3m).
	RunTimeout time.Duration
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// TransferPerBlock is the disaggregated fleets' block pull cost (100µs: one token's prefill,
	// disagg.go says why), DisaggConcurrency their in-flight count (4 engines × MaxNumSeqs × 3/4), and
	// NoDisagg leaves the disaggregated comparison out.
	TransferPerBlock  time.Duration
	DisaggConcurrency int
	NoDisagg          bool
	// NoLoRA leaves the many-adapter comparison out; LoRAParams are lines appended to its adapter-aware
	// route's [routes.lora] (its defaults otherwise).
	NoLoRA     bool
	LoRAParams string
	// LoRAWorkloads are the many-adapter workloads (default LoRAWorkloads).
	LoRAWorkloads []LoRAWorkload
	// Workloads, when set, replace Workload for the scenarios they name (tests use small
	// ones).
	Workloads map[string]loadtest.Workload
}

// Workload returns the workload of a scenario in a repeat.
func (o *Options) Workload(scenario string, repeat int) loadtest.Workload {
	w, ok := o.Workloads[scenario]
	if !ok {
		w = Workload(scenario, o.Scale, o.Seed)
	}
	w.Seed += uint64(repeat)
	return w
}

func (o *Options) Normalize() {
	if o.Engines == 0 {
		o.Engines = 8
	}
	if o.Scale == 0 {
		o.Scale = 4
	}
	if o.Strategies == nil {
		o.Strategies = fleet.Strategies
	}
	if o.LoRAWorkloads == nil {
		o.LoRAWorkloads = LoRAWorkloads
	}
	if o.Scenarios == nil {
		o.Scenarios = Scenarios
	}
	if o.MaxNumSeqs == 0 {
		o.MaxNumSeqs = 4
	}
	if o.Concurrency == 0 {
		o.Concurrency = o.Engines * o.MaxNumSeqs * 3 / 4
	}
	if o.PrefillPerToken == 0 {
		o.PrefillPerToken = 100 * time.Microsecond
	}
	if o.DecodePerToken == 0 {
		o.DecodePerToken = time.Millisecond
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Repeats == 0 {
		o.Repeats = 3
	}
	if o.RunTimeout == 0 {
		o.RunTimeout = 3 * time.Minute
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.TransferPerBlock == 0 {
		o.TransferPerBlock = o.PrefillPerToken
	}
	if o.DisaggConcurrency == 0 {
		o.DisaggConcurrency = 4 * o.MaxNumSeqs * 3 / 4
	}
}

// Unscaled shapes (tokens, blocks); Workload divides them by the scale.
const (
	gspSystem, gspQuestion, gspOutput = 2048, 128, 256 // SGLang bench_serving GSP defaults
	gspGroups, gspPerGroup            = 64, 16
	engineBlocks                      = 2048 // per engine: the GSP working set (64 × 128 blocks) is 4× one engine
	mtUsers, mtRounds                 = 32, 8
	mtHistory                         = 1024
	hotPrefix, hotRequests            = 8192, 512 // docs/architecture.md, "Goals the benchmarks check", goal 2
)

// Workload returns the workload of a scenario at a scale.
func Workload(scenario string, scale int, seed uint64) loadtest.Workload {
	w := loadtest.Workload{Scenario: scenario, Seed: seed, QuestionTokens: gspQuestion / scale, OutputTokens: gspOutput / scale}
	switch scenario {
	case loadtest.SharedPrefix:
		w.Groups, w.PromptsPerGroup, w.Popularity = gspGroups, gspPerGroup, loadtest.Uniform
		w.SystemTokens = gspSystem / scale
	case loadtest.MultiTurn:
		w.Users, w.Rounds = mtUsers, mtRounds
		w.SystemTokens, w.HistoryTokens = gspSystem/scale, mtHistory/scale
	case loadtest.HotPrefix:
		w.Requests, w.SystemTokens = hotRequests, hotPrefix/scale
	case loadtest.Random:
		w.Requests = hotRequests
		w.QuestionTokens = (gspSystem + gspQuestion) / scale
	}
	return w
}

// SimConfig returns the engine configuration of the report.
func (o *Options) SimConfig() sim.Config {
	c := sim.DefaultConfig()
	c.NumBlocks = engineBlocks / o.Scale
	c.MaxNumSeqs = o.MaxNumSeqs
	c.PrefillPerToken = o.PrefillPerToken
	c.DecodePerToken = o.DecodePerToken
	return c
}

// Trial is one (scenario, strategy) measurement.
type Trial struct {
	Scenario string `json:"scenario"`
	Strategy string `json:"strategy"`
	Repeat   int    `json:"repeat"`
	Seed     uint64 `json:"seed"`
	// Unavailable is set ("not available in this build: ...") when the strategy could not run.
	Unavailable string `json:"unavailable,omitempty"`
	// Error is set when the run failed for another reason.
	Error  string           `json:"error,omitempty"`
	Result *loadtest.Result `json:"result,omitempty"`
	// Engine-side counters summed over the fleet (they must agree with the client's).
	EngineHitTokens uint64                `json:"engine_hit_tokens"`
	EngineQueried   uint64                `json:"engine_queried_tokens"`
	EngineEvictions uint64                `json:"engine_evictions"`
	EngineRequests  []int                 `json:"engine_requests"`
	Inflight        fleet.InflightSummary `json:"inflight"`
	// Reuse is the gateway's own routing evidence over the run (docs/routing/evidence.md).
	Reuse           fleet.ReuseSummary `json:"reuse"`
	GroupsSplit     int                `json:"groups_split"`      // groups (users) served by more than one engine
	EnginesPerGroup float64            `json:"engines_per_group"` // mean distinct engines per group (user)
	Seconds         float64            `json:"seconds"`           // the whole run, fleet start to stop
}

// Available reports whether the run measured something.
func (r *Trial) Available() bool { return r.Unavailable == "" && r.Error == "" && r.Result != nil }

// Report is the whole routing-quality report.
type Report struct {
	Options   ReportOptions                `json:"options"`
	Workloads map[string]loadtest.Workload `json:"workloads"`
	Runs      []*Trial                     `json:"runs"`
	Goals     []fleet.Goal                 `json:"goals"`
	// Disagg is the disaggregated prefill/decode comparison (disagg.go); nil when not run.
	Disagg *DisaggReport `json:"disagg,omitempty"`
	// LoRA is the many-adapter comparison (lora.go); nil when not run.
	LoRA    *LoRAReport `json:"lora,omitempty"`
	Started time.Time   `json:"started"`
	Seconds float64     `json:"seconds"`
	// DisaggSeconds is the time of a disaggregated comparison run alone into a loaded report (RunDisagg).
	DisaggSeconds float64       `json:"disagg_seconds,omitempty"`
	Machine       fleet.Machine `json:"machine"`
}

// ReportOptions is the serialisable part of Options.
type ReportOptions struct {
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
}

// Run returns the representative run of a scenario and strategy: among the repeats that
// measured something, the one with the median token hit rate (the lower middle for an even
// count); else the first repeat (which says why it did not run); nil when none ran.
func (r *Report) Run(scenario, strategy string) *Trial {
	var first *Trial
	var ok []*Trial
	for _, run := range r.Runs {
		if run.Scenario != scenario || run.Strategy != strategy {
			continue
		}
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

// medianOf returns the median, lowest and highest of a max/min ratio over the repeats that ran;
// -1 (an idle target: unbounded) sorts above every number and comes back as -1.
func (r *Report) medianOf(scenario, strategy string, f func(*Trial) float64) (med, lo, hi float64) {
	var vs []float64
	for _, run := range r.Runs {
		if run.Scenario == scenario && run.Strategy == strategy && run.Available() {
			v := f(run)
			if v < 0 {
				v = math.Inf(1)
			}
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return 0, 0, 0
	}
	sort.Float64s(vs)
	back := func(v float64) float64 {
		if math.IsInf(v, 1) {
			return -1
		}
		return v
	}
	return back(vs[(len(vs)-1)/2]), back(vs[0]), back(vs[len(vs)-1])
}

// rangeText renders the hit-rate range over repeats: "[0.61–0.63 over 3 runs]".
func (r *Report) rangeText(scenario, strategy string) string {
	lo, hi, n := r.HitRange(scenario, strategy)
	return fmt.Sprintf("[%.3f–%.3f over %d runs]", lo, hi, n)
}

// HitRange returns the lowest and highest token hit rate over the repeats that ran, and their
// number.
func (r *Report) HitRange(scenario, strategy string) (lo, hi float64, n int) {
	for _, run := range r.Runs {
		if run.Scenario == scenario && run.Strategy == strategy && run.Available() {
			h := run.Result.HitRate
			if n == 0 || h < lo {
				lo = h
			}
			if n == 0 || h > hi {
				hi = h
			}
			n++
		}
	}
	return lo, hi, n
}

// Run runs every scenario under every strategy, each on a fresh fleet (cold caches), and
// evaluates the goals. A strategy the build lacks is recorded as unavailable; other failures
// of one run are recorded in it and the report goes on. It returns an error only when ctx ends.
func Run(ctx context.Context, o Options) (*Report, error) {
	o.Normalize()
	sc := o.SimConfig()
	rep := &Report{
		Options: ReportOptions{
			Engines: o.Engines, Scale: o.Scale, Strategies: o.Strategies, Scenarios: o.Scenarios,
			Concurrency: o.Concurrency, MaxNumSeqs: o.MaxNumSeqs, NumBlocks: sc.NumBlocks, BlockSize: sc.BlockSize,
			PrefillPerToken: o.PrefillPerToken.String(), DecodePerToken: o.DecodePerToken.String(), Seed: o.Seed,
			Repeats: o.Repeats,
		},
		Workloads: map[string]loadtest.Workload{},
		Started:   time.Now(),
		Machine:   fleet.DescribeMachine(),
	}
	log := slog.New(slog.NewTextHandler(o.Log, &slog.HandlerOptions{Level: slog.LevelError}))
	// Repeat the whole matrix rather than each run back to back, so a slow spell of a shared
	// machine does not land on one strategy's repeats.
	for repeat := 0; repeat < o.Repeats; repeat++ {
		for _, scenario := range o.Scenarios {
			rep.Workloads[scenario] = o.Workload(scenario, 0)
			for _, strategy := range o.Strategies {
				if err := ctx.Err(); err != nil {
					rep.Goals = goalsOf(rep)
					rep.Seconds = time.Since(rep.Started).Seconds()
					return rep, err
				}
				run := runOne(ctx, &o, sc, scenario, strategy, repeat, log)
				rep.Runs = append(rep.Runs, run)
				switch {
				case run.Unavailable != "":
					fmt.Fprintf(o.Log, "routing: #%d %-13s %-19s %s\n", repeat+1, scenario, strategy, run.Unavailable)
				case run.Error != "":
					fmt.Fprintf(o.Log, "routing: #%d %-13s %-19s error: %s\n", repeat+1, scenario, strategy, run.Error)
				default:
					r := run.Result
					fmt.Fprintf(o.Log, "routing: #%d %-13s %-19s hit %.3f (oracle %.3f) ttft p50 %.0fms p99 %.0fms %.1f req/s share %s errors %d (%.0fs)\n",
						repeat+1, scenario, strategy, r.HitRate, r.OracleHitRate, r.TTFT.P50, r.TTFT.P99, r.Throughput,
						loadtest.FormatMaxMin(r.ShareMaxMin), r.Failed+r.Cancelled, run.Seconds)
				}
			}
		}
	}
	if !o.NoDisagg {
		rep.Disagg = runDisagg(ctx, &o, log)
	}
	if !o.NoLoRA {
		rep.LoRA = runLoRA(ctx, &o, log)
	}
	rep.Goals = goalsOf(rep)
	rep.Seconds = time.Since(rep.Started).Seconds()
	return rep, ctx.Err()
}

// RunDisagg runs the disaggregated comparison alone into rep (a report loaded from its JSON) and
// evaluates the goals again; it returns an error only when ctx ends.
func RunDisagg(ctx context.Context, rep *Report, o Options) error {
	o.Normalize()
	log := slog.New(slog.NewTextHandler(o.Log, &slog.HandlerOptions{Level: slog.LevelError}))
	start := time.Now()
	rep.Disagg = runDisagg(ctx, &o, log)
	rep.Goals = goalsOf(rep)
	rep.DisaggSeconds = time.Since(start).Seconds()
	return ctx.Err()
}

// runOne measures one scenario under one strategy on a fresh fleet.
func runOne(ctx context.Context, o *Options, sc sim.Config, scenario, strategy string, repeat int, log *slog.Logger) *Trial {
	w := o.Workload(scenario, repeat)
	run := &Trial{Scenario: scenario, Strategy: strategy, Repeat: repeat, Seed: w.Seed}
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
		return run
	}
	defer f.Stop()
	precise := strategy == "precise_cache_aware"
	if precise {
		// Let the gateway's subscribers connect before the first event is published (ZMQ drops
		// messages for subscribers that have not joined yet).
		time.Sleep(500 * time.Millisecond)
	}
	sampler := fleet.StartSampler(f.Sims, 20*time.Millisecond)
	res, err := loadtest.Run(ctx, loadtest.Options{
		URL:         f.URL,
		Workload:    w,
		Concurrency: o.Concurrency,
		Duration:    o.RunTimeout,
		Timeout:     time.Minute,
		TokenIDs:    precise,
		TokenizeURL: f.Sims[0].URL(),
		Targets:     f.Names,
		BlockSize:   sc.BlockSize,
		KeepSamples: true,
	})
	samples := sampler.Stop()
	if err != nil {
		run.Error = err.Error()
		return run
	}
	run.Inflight = fleet.SummarizeInflight(samples, len(f.Sims))
	run.Reuse = fleet.ReuseOf(f.Gateway.State())
	for _, e := range f.Sims {
		st := e.Stats()
		run.EngineHitTokens += st.HitTokens
		run.EngineQueried += st.QueriedTokens
		run.EngineEvictions += st.Evictions
		run.EngineRequests = append(run.EngineRequests, int(st.Requests))
	}
	run.GroupsSplit, run.EnginesPerGroup = fleet.GroupSpread(res.Samples)
	res.Samples = nil // the report keeps aggregates only
	run.Result = res
	return run
}

// goalsOf evaluates the routing goals on the report.
func goalsOf(rep *Report) []fleet.Goal {
	var g fleet.Goals
	rep.sharedPrefixGoals(&g)
	rep.hotPrefixGoals(&g)
	for _, scenario := range []string{loadtest.SharedPrefix, loadtest.MultiTurn} {
		rep.preciseGoal(&g, scenario)
	}
	rep.Disagg.goals(&g)
	rep.LoRA.goals(&g)
	return g
}

// goalRun returns the representative run of a cell for a goal, or nil and why it measured nothing.
func (rep *Report) goalRun(scenario, strategy string) (*Trial, string) {
	r := rep.Run(scenario, strategy)
	switch {
	case r == nil:
		return nil, "not run"
	case r.Unavailable != "":
		return nil, strategy + " " + r.Unavailable
	case r.Error != "":
		return nil, strategy + " failed: " + r.Error
	}
	return r, ""
}

// sharedPrefixGoals judges cache_aware on shared-prefix: its hit rate against the oracle bound and
// against round robin's, and how evenly it spread the requests.
func (rep *Report) sharedPrefixGoals(g *fleet.Goals) {
	const (
		gOracle = "cache_aware token hit rate vs the oracle bound (shared-prefix)"
		gRR     = "cache_aware token hit rate vs round_robin's (shared-prefix)"
		gShare  = "cache_aware max/min requests per engine (shared-prefix)"
	)
	sp, why := rep.goalRun(loadtest.SharedPrefix, "cache_aware")
	if sp == nil {
		g.NA(gOracle, ">= 0.96", why)
		g.NA(gRR, ">= 1.8x", why)
		g.NA(gShare, "<= 1.25", why)
		return
	}
	r := sp.Result
	g.Add(gOracle, ">= 0.96",
		fmt.Sprintf("%.3f (hit %.3f %s / oracle %.3f)", r.HitVsOracle, r.HitRate, rep.rangeText(loadtest.SharedPrefix, "cache_aware"), r.OracleHitRate),
		r.HitVsOracle >= 0.96)
	if rr, why := rep.goalRun(loadtest.SharedPrefix, "round_robin"); rr == nil {
		g.NA(gRR, ">= 1.8x", why)
	} else {
		ratio := 0.0
		if rr.Result.HitRate > 0 {
			ratio = r.HitRate / rr.Result.HitRate
		}
		g.Add(gRR, ">= 1.8x",
			fmt.Sprintf("%.2fx (%.3f / %.3f %s)", ratio, r.HitRate, rr.Result.HitRate, rep.rangeText(loadtest.SharedPrefix, "round_robin")),
			rr.Result.HitRate > 0 && ratio >= 1.8 || rr.Result.HitRate == 0 && r.HitRate > 0)
	}
	med, lo, hi := rep.medianOf(loadtest.SharedPrefix, "cache_aware", func(r *Trial) float64 { return r.Result.ShareMaxMin })
	g.Add(gShare, "<= 1.25",
		fmt.Sprintf("%s median over runs (range %s–%s)", loadtest.FormatMaxMin(med), loadtest.FormatMaxMin(lo), loadtest.FormatMaxMin(hi)),
		med > 0 && med <= 1.25)
}

// hotPrefixGoals judges cache_aware on hot-prefix: no engine idle in any repeat (the worst), and the
// in-flight spread (the median over repeats: it varies from run to run).
func (rep *Report) hotPrefixGoals(g *fleet.Goals) {
	const (
		gIdle = "hot-prefix: no idle engine (cache_aware)"
		gInfl = "hot-prefix: max/min in-flight per engine (cache_aware)"
	)
	if hp, why := rep.goalRun(loadtest.HotPrefix, "cache_aware"); hp == nil {
		g.NA(gIdle, "0 idle", why)
		g.NA(gInfl, "<= 1.5", why)
		return
	}
	idle, noRequests, runs := 0, 0, 0
	for _, run := range rep.Runs {
		if run.Scenario != loadtest.HotPrefix || run.Strategy != "cache_aware" || !run.Available() {
			continue
		}
		runs++
		idle = max(idle, run.Inflight.Idle)
		n := 0
		for _, t := range run.Result.Targets {
			if t.Requests == 0 {
				n++
			}
		}
		noRequests = max(noRequests, n)
	}
	g.Add(gIdle, "0 idle",
		fmt.Sprintf("at most %d idle (empty in > half the samples) and %d without a request, over %d runs", idle, noRequests, runs),
		idle == 0 && noRequests == 0)
	med, lo, hi := rep.medianOf(loadtest.HotPrefix, "cache_aware", func(r *Trial) float64 { return r.Inflight.MaxMin })
	g.Add(gInfl, "<= 1.5",
		fmt.Sprintf("%s median over runs (range %s–%s)", loadtest.FormatMaxMin(med), loadtest.FormatMaxMin(lo), loadtest.FormatMaxMin(hi)),
		med > 0 && med <= 1.5)
}

// preciseGoal judges precise_cache_aware's hit rate against cache_aware's on scenario.
func (rep *Report) preciseGoal(g *fleet.Goals, scenario string) {
	name := "precise_cache_aware token hit rate >= cache_aware's under KV pressure (" + scenario + ")"
	p, why := rep.goalRun(scenario, "precise_cache_aware")
	if p == nil {
		g.NA(name, ">= 1.0x", why)
		return
	}
	c, why := rep.goalRun(scenario, "cache_aware")
	if c == nil {
		g.NA(name, ">= 1.0x", why)
		return
	}
	g.Add(name, ">= 1.0x",
		fmt.Sprintf("%.3f %s vs %.3f %s", p.Result.HitRate, rep.rangeText(scenario, "precise_cache_aware"),
			c.Result.HitRate, rep.rangeText(scenario, "cache_aware")),
		p.Result.HitRate >= c.Result.HitRate)
}
