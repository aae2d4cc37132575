package pressure

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/loadtest"
	"github.com/rolter-ai/rolter/sim"
)

// Capacities are the engines' KV capacities of the report, as fractions of the per-engine working
// set.
var Capacities = []float64{0.25, 0.5, 1}

// Options configure the KV-pressure report. Zero values take the defaults named.
type Options struct {
	// Engines is the fleet size (4).
	Engines int
	// Capacities are each engine's KV blocks as fractions of the workload's working set divided over the
	// engines (Capacities).
	Capacities []float64
	// Strategies to compare (fleet.Strategies). An entry may carry route parameters,
	// "cache_aware:max_trie_bytes=1kv,threshold=0.3" (ParseStrategySpec).
	Strategies []string
	// Workloads to run (WorkloadNames).
	Workloads []string
	// Quick runs the small workloads (DefaultWorkload's quick shapes) with instant engines.
	Quick bool
	// Seed of the workloads (1): the same for every strategy and capacity.
	Seed uint64
	// MaxNumSeqs per engine (4).
	MaxNumSeqs int
	// Concurrency is the closed-loop in-flight count (Engines × MaxNumSeqs × 3/2 = 24: every engine busy
	// and a queue behind it).
	Concurrency int
	// PrefillPerToken (20µs: a cold 2,500-token prompt spends 50 ms in prefill) and DecodePerToken (1ms).
	// Quick: 1µs and 100µs.
	PrefillPerToken time.Duration
	DecodePerToken  time.Duration
	// Epsilon is the placement oracle's load cap (0.25; PlacementOracle).
	Epsilon float64
	// Recommended is the strategy the goals judge (Recommended).
	Recommended string
	// RunTimeout bounds one cell's load (2m); Timeout the whole report (30m): what was measured by then is
	// reported.
	RunTimeout time.Duration
	Timeout    time.Duration
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// Shapes, when set, replace the default workloads they name (tests).
	Shapes map[string]Workload
}

func (o *Options) normalize() {
	if o.Engines == 0 {
		o.Engines = 4
	}
	if o.Capacities == nil {
		o.Capacities = Capacities
	}
	if o.Strategies == nil {
		o.Strategies = fleet.Strategies
	}
	if o.Workloads == nil {
		o.Workloads = WorkloadNames
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.MaxNumSeqs == 0 {
		o.MaxNumSeqs = 4
	}
	if o.Concurrency == 0 {
		o.Concurrency = o.Engines * o.MaxNumSeqs * 3 / 2
	}
	if o.PrefillPerToken == 0 {
		o.PrefillPerToken = 20 * time.Microsecond
		if o.Quick {
			o.PrefillPerToken = time.Microsecond
		}
	}
	if o.DecodePerToken == 0 {
		o.DecodePerToken = time.Millisecond
		if o.Quick {
			o.DecodePerToken = 100 * time.Microsecond
		}
	}
	if o.Epsilon == 0 {
		o.Epsilon = 0.25
	}
	if o.Recommended == "" {
		o.Recommended = Recommended
	}
	if o.RunTimeout == 0 {
		o.RunTimeout = 2 * time.Minute
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Minute
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
}

// workload returns the shape of a workload name.
func (o *Options) workload(name string) Workload {
	if w, ok := o.Shapes[name]; ok {
		return w
	}
	return DefaultWorkload(name, o.Quick, o.Seed)
}

// StrategySpec is one row of the report: a strategy and the route parameters it runs with.
type StrategySpec struct {
	// Label is the spec as given ("cache_aware:max_trie_bytes=1kv").
	Label    string
	Strategy string
	// Params are key = value pairs in the order given; a value "<f>kv" is f times one engine's KV
	// capacity in prompt-key bytes (ParamValue).
	Params [][2]string
}

// ParseStrategySpec parses "name" or "name:key=value,key=value".
func ParseStrategySpec(s string) (StrategySpec, error) {
	spec := StrategySpec{Label: s}
	name, params, ok := strings.Cut(s, ":")
	spec.Strategy = strings.TrimSpace(name)
	if spec.Strategy == "" {
		return spec, fmt.Errorf("cannot parse strategy %q: no name", s)
	}
	if !ok {
		return spec, nil
	}
	for _, kv := range strings.Split(params, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return spec, fmt.Errorf("cannot parse strategy %q: parameter %q is not key=value", s, kv)
		}
		if _, err := paramValue(v, 1, 16); err != nil {
			return spec, fmt.Errorf("cannot parse strategy %q: %w", s, err)
		}
		spec.Params = append(spec.Params, [2]string{k, v})
	}
	return spec, nil
}

// paramValue renders a parameter value as TOML: "<f>kv" becomes f × numBlocks × blockSize × 4, the bytes
// of prompt key one engine's KV cache holds (the workloads' words are 4 bytes a token: "abc "); a number or
// a boolean stays as it is.
func paramValue(v string, numBlocks, blockSize int) (string, error) {
	if f, ok := strings.CutSuffix(v, "kv"); ok {
		x, err := strconv.ParseFloat(f, 64)
		if err != nil || !(x > 0) {
			return "", fmt.Errorf("cannot use %q: want <positive number>kv", v)
		}
		return strconv.Itoa(int(x * float64(numBlocks*blockSize*4))), nil
	}
	if v == "true" || v == "false" {
		return v, nil
	}
	if _, err := strconv.ParseFloat(v, 64); err != nil {
		return "", fmt.Errorf("cannot use %q: want a number, a boolean or <number>kv", v)
	}
	return v, nil
}

// routeParams renders the spec's parameters as a [routes.params] table for an engine of numBlocks.
func (s StrategySpec) routeParams(numBlocks, blockSize int) string {
	if len(s.Params) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n[routes.params]\n")
	for _, kv := range s.Params {
		v, _ := paramValue(kv[1], numBlocks, blockSize) // checked by ParseStrategySpec
		fmt.Fprintf(&b, "%s = %s\n", kv[0], v)
	}
	return b.String()
}

// Report is the whole KV-pressure report.
type Report struct {
	Options   ReportOptions   `json:"options"`
	Workloads []*WorkloadInfo `json:"workloads"`
	Cells     []*Cell         `json:"cells"`
	Goals     []fleet.Goal    `json:"goals"`
	Started   time.Time       `json:"started"`
	Seconds   float64         `json:"seconds"`
	Machine   fleet.Machine   `json:"machine"`
}

// ReportOptions is the serialisable part of Options, defaults filled in.
type ReportOptions struct {
	Engines         int       `json:"engines"`
	Capacities      []float64 `json:"capacities"`
	Strategies      []string  `json:"strategies"`
	Workloads       []string  `json:"workloads"`
	Quick           bool      `json:"quick"`
	Seed            uint64    `json:"seed"`
	MaxNumSeqs      int       `json:"max_num_seqs"`
	Concurrency     int       `json:"concurrency"`
	BlockSize       int       `json:"block_size"`
	PrefillPerToken string    `json:"prefill_per_token"`
	DecodePerToken  string    `json:"decode_per_token"`
	Epsilon         float64   `json:"epsilon"`
	Recommended     string    `json:"recommended"`
}

// WorkloadInfo is one workload: its shape, its plan's working set, and the engines' KV blocks at
// each capacity.
type WorkloadInfo struct {
	Workload Workload  `json:"workload"`
	Plan     PlanStats `json:"plan"`
	// PerEngine is the working set divided over the engines: ⌈Plan.Blocks / Engines⌉.
	PerEngine int     `json:"per_engine_blocks"`
	Levels    []Level `json:"levels"`
}

// Level is one capacity of a workload.
type Level struct {
	Capacity float64 `json:"capacity"`
	// NumBlocks is each engine's KV blocks: round(Capacity × PerEngine), at least Plan.MaxRequestBlocks (the
	// engine cannot run a longer request); Raised says the minimum applied.
	NumBlocks int  `json:"num_blocks"`
	Raised    bool `json:"raised,omitempty"`
	// PlacementHitRate and PooledHitRate are the capacity-aware references over the plan's order (each cell
	// has its own over its send order). RoundRobinHitRate is the same per-engine LRU model fed in strict
	// rotation: what round robin can reach, so PlacementHitRate ÷ RoundRobinHitRate is the most any
	// placement can gain over round robin in this model.
	PlacementHitRate  float64 `json:"placement_hit_rate"`
	PooledHitRate     float64 `json:"pooled_hit_rate"`
	RoundRobinHitRate float64 `json:"round_robin_hit_rate"`
}

// Cell is one (workload, capacity, strategy) run.
type Cell struct {
	Workload  string  `json:"workload"`
	Capacity  float64 `json:"capacity"`
	NumBlocks int     `json:"num_blocks"`
	Strategy  string  `json:"strategy"` // the spec's label
	// Unavailable is set ("not available in this build: ...") when the strategy could not run; Error when
	// the run failed for another reason.
	Unavailable string `json:"unavailable,omitempty"`
	Error       string `json:"error,omitempty"`

	Planned   int `json:"planned"`
	Sent      int `json:"sent"`
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	Cancelled int `json:"cancelled"`

	// HitRate is Σ cached_tokens / Σ prompt_tokens of the answered requests, from the engines' own usage;
	// EnginePromptTokens and EngineCachedTokens are the engines' counters (they agree).
	HitRate            float64 `json:"token_hit_rate"`
	EnginePromptTokens uint64  `json:"engine_prompt_tokens"`
	EngineCachedTokens uint64  `json:"engine_cached_tokens"`
	// OracleHitRate is the infinite-cache bound, PlacementHitRate the capacity-aware placement reference
	// (PlacementOracle) and PooledHitRate one pooled LRU cache of the fleet's blocks
	// (loadtest.CapacityOracle), all over this cell's prompts in send order.
	OracleHitRate    float64 `json:"oracle_hit_rate"`
	PlacementHitRate float64 `json:"placement_hit_rate"`
	PooledHitRate    float64 `json:"pooled_hit_rate"`
	// VsRoundRobin is HitRate over round_robin's in the same workload and capacity (0: not run).
	VsRoundRobin float64 `json:"vs_round_robin"`

	TTFT       loadtest.Dist `json:"ttft_ms"`
	Throughput float64       `json:"throughput_rps"`
	// Load is how the requests spread over the engines in the whole run; Burst the same over the hot-prefix
	// burst (from its first hot request to its last, in send order; hot-prefix-burst only).
	Load  LoadSpread  `json:"load"`
	Burst *LoadSpread `json:"burst,omitempty"`
	// Inflight is each engine's running + waiting requests sampled every 20 ms (middle 80% of the run).
	Inflight  fleet.InflightSummary `json:"inflight"`
	Evictions []uint64              `json:"engine_evictions"`
	Decisions map[string]int        `json:"decisions,omitempty"`
	// ByDecision is the answered requests' prompt and cached tokens per decision: what each kind of
	// decision delivered.
	ByDecision map[string]DecisionTokens `json:"by_decision,omitempty"`
	// Claims compare the gateway's prefix-match score with what the engine delivered, per request.
	Claims ClaimStats `json:"claims"`
	// Reuse is the gateway's routing evidence; TrieResets its tries emptied during the run, by reason;
	// TrieEvictions the prompts its tries pruned at their ceilings.
	Reuse         fleet.ReuseSummary `json:"reuse"`
	TrieResets    map[string]uint64  `json:"trie_resets,omitempty"`
	TrieEvictions uint64             `json:"trie_evictions"`
	// GroupsSplit counts the groups (conversations) whose requests went to more than one engine;
	// EnginesPerGroup is the mean number of engines per group.
	GroupsSplit     int     `json:"groups_split"`
	EnginesPerGroup float64 `json:"engines_per_group"`
	WallSeconds     float64 `json:"wall_seconds"`
	Seconds         float64 `json:"seconds"`
	// OtherCPU is the mean number of CPUs other processes kept busy during the load (-1: unknown). Latencies
	// of a cell where it is high were measured on a machine busy with other work.
	OtherCPU float64 `json:"other_cpu"`
}

// Available reports whether the cell measured something.
func (c *Cell) Available() bool { return c.Unavailable == "" && c.Error == "" && c.Sent > 0 }

// VsOracle is HitRate over the infinite-cache bound (0 when the bound is 0).
func (c *Cell) VsOracle() float64 { return pressureDiv(c.HitRate, c.OracleHitRate) }

// VsPlacement is HitRate over the capacity-aware placement reference (0 when it is 0).
func (c *Cell) VsPlacement() float64 { return pressureDiv(c.HitRate, c.PlacementHitRate) }

func pressureDiv(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// LoadSpread is how requests spread over the engines.
type LoadSpread struct {
	Requests []int `json:"requests"`
	// Prefill is the prompt tokens each engine computed (prompt − cached).
	Prefill []int64 `json:"prefill_tokens"`
	// BusiestIdlest is max/min of Requests, BusiestIdlestPrefill of Prefill; -1 when an engine got none.
	BusiestIdlest        float64 `json:"busiest_idlest"`
	BusiestIdlestPrefill float64 `json:"busiest_idlest_prefill"`
	// Idle counts the engines with fewer than 5% of the mean requests.
	Idle int `json:"idle_engines"`
}

// DecisionTokens are the requests of one decision and their prompt and cached tokens.
type DecisionTokens struct {
	Requests     int   `json:"requests"`
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
}

// byDecision sums the answered samples' tokens per decision.
func byDecision(samples []loadtest.Sample) map[string]DecisionTokens {
	out := map[string]DecisionTokens{}
	for i := range samples {
		s := &samples[i]
		if s.Error != "" || s.Decision == "" {
			continue
		}
		d := out[s.Decision]
		d.Requests++
		d.PromptTokens += int64(s.PromptTokens)
		d.CachedTokens += int64(s.CachedTokens)
		out[s.Decision] = d
	}
	return out
}

// ClaimStats compare, over the requests a cache strategy sent to a holder (decision prefix_hit), the
// predicted prefix-match fraction (x-rolter-prefix-match: prompt-key bytes for the trie strategies, blocks
// for precise_cache_aware) with the delivered one (cached / prompt tokens).
type ClaimStats struct {
	PrefixHits int     `json:"prefix_hits"`
	Predicted  float64 `json:"predicted"` // mean over them
	Delivered  float64 `json:"delivered"` // mean over them
	// Stale counts the prefix hits that got less than half the predicted reuse: the trie claimed a prefix
	// the engine no longer held (evicted, or not yet cached by a request still in prefill).
	Stale int `json:"stale"`
	// Missed counts the prefix hits that got no cached token at all.
	Missed int `json:"missed"`
}

// Run runs every workload at every capacity under every strategy, each cell on a fresh fleet (cold
// caches, empty tries), and evaluates the goals. A strategy the build lacks is recorded as unavailable;
// other failures of one cell are recorded in it and the report goes on. It returns an error when the
// options are bad, and ctx's error (or the report timeout's) with what was measured when it ends early.
func Run(ctx context.Context, o Options) (*Report, error) {
	o.normalize()
	specs := make([]StrategySpec, 0, len(o.Strategies))
	for _, s := range o.Strategies {
		spec, err := ParseStrategySpec(s)
		if err != nil {
			return nil, err
		}
		specs = append(specs, spec)
	}
	base := sim.DefaultConfig()
	rep := &Report{
		Options: ReportOptions{
			Engines: o.Engines, Capacities: o.Capacities, Strategies: o.Strategies, Workloads: o.Workloads, Quick: o.Quick,
			Seed: o.Seed, MaxNumSeqs: o.MaxNumSeqs, Concurrency: o.Concurrency, BlockSize: base.BlockSize,
			PrefillPerToken: o.PrefillPerToken.String(), DecodePerToken: o.DecodePerToken.String(), Epsilon: o.Epsilon,
			Recommended: o.Recommended,
		},
		Started: time.Now(),
		Machine: fleet.DescribeMachine(),
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	log := slog.New(slog.NewTextHandler(o.Log, &slog.HandlerOptions{Level: slog.LevelError}))
	finish := func(err error) (*Report, error) {
		rep.fillRoundRobin()
		rep.Goals = goalsOf(rep)
		rep.Seconds = time.Since(rep.Started).Seconds()
		return rep, err
	}
	for _, name := range o.Workloads {
		w := o.workload(name)
		plan, err := w.Plan()
		if err != nil {
			return finish(err)
		}
		info := &WorkloadInfo{Workload: w, Plan: pressurePlanStats(plan, base.BlockSize)}
		info.PerEngine = (info.Plan.Blocks + o.Engines - 1) / o.Engines
		rep.Workloads = append(rep.Workloads, info)
		fmt.Fprintf(o.Log, "pressure: %s: %d requests, %d prompt tokens, working set %d blocks (%d per engine), largest request %d blocks, infinite-cache bound %.3f\n",
			name, info.Plan.Requests, info.Plan.PromptTokens, info.Plan.Blocks, info.PerEngine, info.Plan.MaxRequestBlocks, info.Plan.OracleHitRate)
		for _, capacity := range o.Capacities {
			lv := Level{Capacity: capacity, NumBlocks: int(math.Round(capacity * float64(info.PerEngine)))}
			if lv.NumBlocks < info.Plan.MaxRequestBlocks {
				lv.NumBlocks, lv.Raised = info.Plan.MaxRequestBlocks, true
			}
			lv.PlacementHitRate, lv.PooledHitRate, lv.RoundRobinHitRate = planReferences(plan, o.Engines, lv.NumBlocks, base.BlockSize, o.Epsilon)
			info.Levels = append(info.Levels, lv)
			fmt.Fprintf(o.Log, "pressure: %s at %.0f%%: %d blocks per engine, placement reference %.3f, pooled LRU %.3f, round-robin LRU %.3f\n",
				name, 100*capacity, lv.NumBlocks, lv.PlacementHitRate, lv.PooledHitRate, lv.RoundRobinHitRate)
			sc := base
			sc.NumBlocks = lv.NumBlocks
			sc.MaxNumSeqs = o.MaxNumSeqs
			sc.PrefillPerToken = o.PrefillPerToken
			sc.DecodePerToken = o.DecodePerToken
			for _, spec := range specs {
				if err := ctx.Err(); err != nil {
					return finish(err)
				}
				c := runPressureCell(ctx, &o, sc, info, plan, capacity, spec, log)
				rep.Cells = append(rep.Cells, c)
				switch {
				case c.Unavailable != "":
					fmt.Fprintf(o.Log, "pressure: %-16s %3.0f%% %-19s %s\n", name, 100*capacity, spec.Label, c.Unavailable)
				case c.Error != "":
					fmt.Fprintf(o.Log, "pressure: %-16s %3.0f%% %-19s error: %s\n", name, 100*capacity, spec.Label, c.Error)
				default:
					fmt.Fprintf(o.Log, "pressure: %-16s %3.0f%% %-19s hit %.3f (placement %.3f, ∞ %.3f) ttft p50 %.0f p99 %.0f ms, %.0f req/s, busiest/idlest %s, failed %d (%.0fs)\n",
						name, 100*capacity, spec.Label, c.HitRate, c.PlacementHitRate, c.OracleHitRate, c.TTFT.P50, c.TTFT.P99,
						c.Throughput, loadtest.FormatMaxMin(c.Load.BusiestIdlest), c.Failed+c.Cancelled, c.Seconds)
				}
			}
		}
	}
	return finish(ctx.Err())
}

// planReferences returns the placement reference, the pooled LRU and the round-robin LRU over p in plan
// order.
func planReferences(p *loadtest.Plan, engines, numBlocks, blockSize int, epsilon float64) (placement, pooled, roundRobin float64) {
	po := NewPlacementOracle(engines, numBlocks, blockSize, epsilon)
	rr := NewPlacementOracle(engines, numBlocks, blockSize, epsilon)
	lru := loadtest.NewCapacityOracle(blockSize, engines*numBlocks)
	var tokens []uint32
	for i := range p.Requests {
		tokens = pressureTokens(tokens[:0], p.Requests[i].Messages)
		po.Add(tokens)
		rr.AddTo(i%engines, tokens)
		lru.AddTokens(tokens)
	}
	return po.HitRate(), lru.HitRate(), rr.HitRate()
}

// runPressureCell measures one strategy on a fresh fleet of engines configured by sc.
func runPressureCell(ctx context.Context, o *Options, sc sim.Config, info *WorkloadInfo, plan *loadtest.Plan,
	capacity float64, spec StrategySpec, log *slog.Logger) *Cell {
	c := &Cell{Workload: info.Workload.Name, Capacity: capacity, NumBlocks: sc.NumBlocks, Strategy: spec.Label}
	start := time.Now()
	defer func() { c.Seconds = time.Since(start).Seconds() }()
	f, err := fleet.Start(o.Engines, sc, spec.Strategy, log, spec.routeParams(sc.NumBlocks, sc.BlockSize))
	if err != nil {
		var ue *fleet.UnavailableError
		if errors.As(err, &ue) {
			c.Unavailable = "not available in this build: " + ue.Reason
		} else {
			c.Error = err.Error()
		}
		return c
	}
	defer f.Stop()
	precise := spec.Strategy == "precise_cache_aware"
	if precise {
		// As in the routing report: let the subscribers connect before the first event.
		time.Sleep(500 * time.Millisecond)
	}
	before := scrapeTrieCounters(ctx, f.URL)
	sampler := fleet.StartSampler(f.Sims, 20*time.Millisecond)
	meter := fleet.StartCPUMeter()
	res, err := loadtest.Run(ctx, loadtest.Options{
		URL:            f.URL,
		Plan:           plan,
		Concurrency:    o.Concurrency,
		Duration:       o.RunTimeout,
		Timeout:        time.Minute,
		TokenIDs:       precise,
		TokenizeURL:    f.Sims[0].URL(),
		Targets:        f.Names,
		BlockSize:      sc.BlockSize,
		OracleCapacity: o.Engines * sc.NumBlocks,
		KeepSamples:    true,
	})
	c.OtherCPU = meter.Others()
	samples := sampler.Stop()
	if err != nil {
		c.Error = err.Error()
		return c
	}
	after := scrapeTrieCounters(ctx, f.URL)
	c.Planned, c.Sent, c.Succeeded, c.Failed, c.Cancelled = res.Planned, res.Sent, res.Succeeded, res.Failed, res.Cancelled
	c.HitRate, c.OracleHitRate, c.PooledHitRate = res.HitRate, res.OracleHitRate, res.CapacityOracleHitRate
	c.TTFT, c.Throughput, c.Decisions, c.WallSeconds = res.TTFT, res.Throughput, res.Decisions, res.WallSeconds
	for _, e := range f.Sims {
		st := e.Stats()
		c.EnginePromptTokens += st.QueriedTokens
		c.EngineCachedTokens += st.HitTokens
		c.Evictions = append(c.Evictions, st.Evictions)
	}
	c.Inflight = fleet.SummarizeInflight(samples, len(f.Sims))
	c.Reuse = fleet.ReuseOf(f.Gateway.State())
	c.TrieResets, c.TrieEvictions = after.since(before)

	// Samples in send order: the placement reference replays them as they were sent.
	smp := res.Samples
	sort.Slice(smp, func(i, j int) bool { return smp[i].Index < smp[j].Index })
	po := NewPlacementOracle(o.Engines, sc.NumBlocks, sc.BlockSize, o.Epsilon)
	var tokens []uint32
	for i := range smp {
		tokens = pressureTokens(tokens[:0], smp[i].Prompt)
		po.Add(tokens)
	}
	c.PlacementHitRate = po.HitRate()
	c.Load = loadSpread(smp, f.Names)
	if info.Workload.Name == HotBurst {
		hot := info.Workload.hotGroup()
		first, last := -1, -1
		for i := range smp {
			if smp[i].Group == hot {
				if first < 0 {
					first = i
				}
				last = i
			}
		}
		if first >= 0 {
			b := loadSpread(smp[first:last+1], f.Names)
			c.Burst = &b
		}
	}
	c.Claims = claimStats(smp)
	c.ByDecision = byDecision(smp)
	c.GroupsSplit, c.EnginesPerGroup = fleet.GroupSpread(smp)
	return c
}

// loadSpread counts the answered samples' requests and prefill tokens per engine (names in fleet order).
func loadSpread(samples []loadtest.Sample, names []string) LoadSpread {
	idx := map[string]int{}
	for i, n := range names {
		idx[n] = i
	}
	s := LoadSpread{Requests: make([]int, len(names)), Prefill: make([]int64, len(names))}
	for i := range samples {
		sm := &samples[i]
		k, ok := idx[sm.Target]
		if !ok || sm.Error != "" {
			continue
		}
		s.Requests[k]++
		s.Prefill[k] += int64(sm.PromptTokens - sm.CachedTokens)
	}
	s.BusiestIdlest, _ = fleet.Spread(s.Requests)
	prefill := make([]int, len(s.Prefill))
	for i, v := range s.Prefill {
		prefill[i] = int(v)
	}
	s.BusiestIdlestPrefill, _ = fleet.Spread(prefill)
	total := 0
	for _, n := range s.Requests {
		total += n
	}
	mean := float64(total) / float64(max(len(names), 1))
	for _, n := range s.Requests {
		if float64(n) < 0.05*mean {
			s.Idle++
		}
	}
	return s
}

// claimStats compares the predicted and delivered reuse of the prefix_hit decisions.
func claimStats(samples []loadtest.Sample) ClaimStats {
	var c ClaimStats
	var pred, del float64
	for i := range samples {
		s := &samples[i]
		if s.Decision != "prefix_hit" || s.PrefixMatch < 0 || s.Error != "" || s.PromptTokens == 0 {
			continue
		}
		d := float64(s.CachedTokens) / float64(s.PromptTokens)
		c.PrefixHits++
		pred += s.PrefixMatch
		del += d
		if d < 0.5*s.PrefixMatch {
			c.Stale++
		}
		if s.CachedTokens == 0 {
			c.Missed++
		}
	}
	if c.PrefixHits > 0 {
		c.Predicted, c.Delivered = pred/float64(c.PrefixHits), del/float64(c.PrefixHits)
	}
	return c
}

// trieCounters are the gateway's trie counters from its /metrics: resets by reason, and evictions.
type trieCounters struct {
	resets    map[string]uint64
	evictions uint64
}

// since returns c − before.
func (c trieCounters) since(before trieCounters) (map[string]uint64, uint64) {
	out := map[string]uint64{}
	for k, v := range c.resets {
		if v > before.resets[k] {
			out[k] = v - before.resets[k]
		}
	}
	if len(out) == 0 {
		out = nil
	}
	ev := uint64(0)
	if c.evictions > before.evictions {
		ev = c.evictions - before.evictions
	}
	return out, ev
}

// scrapeTrieCounters reads rolter_trie_resets_total and rolter_trie_evictions_total from the gateway at
// url. The metrics registry is process-wide, so the report takes differences over a run; a failed scrape
// gives zeros.
func scrapeTrieCounters(ctx context.Context, url string) trieCounters {
	c := trieCounters{resets: map[string]uint64{}}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return c
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return c
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var name string
		switch {
		case strings.HasPrefix(line, "rolter_trie_resets_total{"):
			name = "resets"
		case strings.HasPrefix(line, "rolter_trie_evictions_total{"):
			name = "evictions"
		default:
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			continue
		}
		if name == "evictions" {
			c.evictions += uint64(v)
			continue
		}
		reason := "?"
		if _, after, ok := strings.Cut(line, `reason="`); ok {
			reason, _, _ = strings.Cut(after, `"`)
		}
		c.resets[reason] += uint64(v)
	}
	return c
}

// fillRoundRobin sets every cell's VsRoundRobin.
func (rep *Report) fillRoundRobin() {
	for _, c := range rep.Cells {
		c.VsRoundRobin = 0
		if rr := rep.Cell(c.Workload, c.Capacity, "round_robin"); rr != nil && rr.Available() && c.Available() {
			c.VsRoundRobin = pressureDiv(c.HitRate, rr.HitRate)
		}
	}
}

// Cell returns the cell of a workload, capacity and strategy label, or nil.
func (rep *Report) Cell(workload string, capacity float64, strategy string) *Cell {
	for _, c := range rep.Cells {
		if c.Workload == workload && c.Capacity == capacity && c.Strategy == strategy {
			return c
		}
	}
	return nil
}

// Info returns the workload info of name, or nil.
func (rep *Report) Info(name string) *WorkloadInfo {
	for _, w := range rep.Workloads {
		if w.Workload.Name == name {
			return w
		}
	}
	return nil
}

// Recommended is the strategy the report's goals judge: the one we recommend for KV-pressure
// workloads, chosen from this report's measurements (pipeline with load_factor 2.2 and hot_window
// 128 led every workload at 50%; cache_aware's seed overload rule spills too often under KV pressure).
const Recommended = "pipeline"

// goalCapacity is the capacity the goals are judged at.
const goalCapacity = 0.5

// goalsOf evaluates the KV-pressure goals for the recommended strategy at 50% capacity.
func goalsOf(rep *Report) []fleet.Goal {
	var goals []fleet.Goal
	s := rep.Options.Recommended
	add := func(name, target, measured string, ok bool) {
		goals = append(goals, fleet.Goal{Name: name, Target: target, Measured: measured, Verdict: fleet.Verdict(ok)})
	}
	na := func(name, target, why string) {
		goals = append(goals, fleet.Goal{Name: name, Target: target, Measured: why, Verdict: "n/a"})
	}
	get := func(workload string) (*Cell, string) {
		c := rep.Cell(workload, goalCapacity, s)
		switch {
		case c == nil:
			return nil, "not run"
		case c.Unavailable != "":
			return nil, c.Unavailable
		case c.Error != "":
			return nil, "failed: " + c.Error
		case !c.Available():
			return nil, "nothing sent"
		}
		return c, ""
	}
	for _, wl := range []string{SharedPrefix, MultiTurn} {
		nameP := fmt.Sprintf("%s hit rate vs the capacity-aware placement reference (%s, 50%%)", s, wl)
		nameR := fmt.Sprintf("%s hit rate vs round_robin's (%s, 50%%)", s, wl)
		c, why := get(wl)
		if c == nil {
			na(nameP, ">= 0.96", why)
			na(nameR, ">= 2x", why)
			continue
		}
		add(nameP, ">= 0.96", fmt.Sprintf("%.3f (%.3f / %.3f)", c.VsPlacement(), c.HitRate, c.PlacementHitRate), c.VsPlacement() >= 0.96)
		if rr := rep.Cell(wl, goalCapacity, "round_robin"); rr == nil || !rr.Available() {
			na(nameR, ">= 2x", "round_robin did not run")
		} else {
			ceiling := ""
			if info := rep.Info(wl); info != nil {
				if lv := info.level(goalCapacity); lv != nil && lv.RoundRobinHitRate > 0 {
					ceiling = fmt.Sprintf("; the placement reference is %.2fx the round-robin LRU model", lv.PlacementHitRate/lv.RoundRobinHitRate)
				}
			}
			add(nameR, ">= 2x", fmt.Sprintf("%.2fx (%.3f / %.3f%s)", c.VsRoundRobin, c.HitRate, rr.HitRate, ceiling),
				rr.HitRate > 0 && c.VsRoundRobin >= 2 || rr.HitRate == 0 && c.HitRate > 0)
		}
	}
	{
		name := fmt.Sprintf("%s: no idle engine (every workload, 50%%)", s)
		var parts []string
		idle, ran := 0, 0
		for _, wl := range rep.Options.Workloads {
			c, _ := get(wl)
			if c == nil {
				continue
			}
			ran++
			n := c.Load.Idle
			if c.Burst != nil {
				n = max(n, c.Burst.Idle)
			}
			idle += n
			parts = append(parts, fmt.Sprintf("%s %d", wl, n))
		}
		if ran == 0 {
			na(name, "0 idle", "not run")
		} else {
			add(name, "0 idle", strings.Join(parts, ", "), idle == 0)
		}
	}
	{
		name := fmt.Sprintf("%s: busiest/idlest engine by requests during the hot-prefix burst (50%%)", s)
		c, why := get(HotBurst)
		switch {
		case c == nil:
			na(name, "<= 1.5", why)
		case c.Burst == nil:
			na(name, "<= 1.5", "no hot request was sent")
		default:
			b := c.Burst
			add(name, "<= 1.5", fmt.Sprintf("%s (requests %s; prefill tokens busiest/idlest %s)", loadtest.FormatMaxMin(b.BusiestIdlest),
				pressureJoin(b.Requests), loadtest.FormatMaxMin(b.BusiestIdlestPrefill)), b.BusiestIdlest > 0 && b.BusiestIdlest <= 1.5)
		}
	}
	return goals
}

func pressureJoin[T int | int64 | uint64](v []T) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, " / ")
}
