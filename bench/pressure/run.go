package pressure

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/loadtest"
	"github.com/rolter-ai/rolter/sim"
)

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
		info := newWorkloadInfo(&o, w, plan, base.BlockSize)
		rep.Workloads = append(rep.Workloads, info)
		for _, capacity := range o.Capacities {
			lv := info.newLevel(&o, plan, capacity, base.BlockSize)
			sc := base
			sc.NumBlocks = lv.NumBlocks
			sc.MaxNumSeqs = o.MaxNumSeqs
			sc.PrefillPerToken = o.PrefillPerToken
			sc.DecodePerToken = o.DecodePerToken
			for _, spec := range specs {
				if err := ctx.Err(); err != nil {
					return finish(err)
				}
				c := runCell(ctx, &o, sc, info, plan, capacity, spec, log)
				rep.Cells = append(rep.Cells, c)
				logCell(&o, c)
			}
		}
	}
	return finish(ctx.Err())
}

// newWorkloadInfo describes workload w's plan: its working set and that over the engines.
func newWorkloadInfo(o *Options, w Workload, plan *loadtest.Plan, blockSize int) *WorkloadInfo {
	info := &WorkloadInfo{Workload: w, Plan: planStats(plan, blockSize)}
	info.PerEngine = (info.Plan.Blocks + o.Engines - 1) / o.Engines
	fmt.Fprintf(o.Log, "pressure: %s: %d requests, %d prompt tokens, working set %d blocks (%d per engine), largest request %d blocks, infinite-cache bound %.3f\n",
		w.Name, info.Plan.Requests, info.Plan.PromptTokens, info.Plan.Blocks, info.PerEngine, info.Plan.MaxRequestBlocks, info.Plan.OracleHitRate)
	return info
}

// newLevel adds the level of capacity to w: the engines' KV blocks and the references over the plan.
func (w *WorkloadInfo) newLevel(o *Options, plan *loadtest.Plan, capacity float64, blockSize int) Level {
	lv := Level{Capacity: capacity, NumBlocks: int(math.Round(capacity * float64(w.PerEngine)))}
	if lv.NumBlocks < w.Plan.MaxRequestBlocks {
		lv.NumBlocks, lv.Raised = w.Plan.MaxRequestBlocks, true
	}
	lv.PlacementHitRate, lv.PooledHitRate, lv.RoundRobinHitRate = planReferences(plan, o.Engines, lv.NumBlocks, blockSize, o.Epsilon)
	w.Levels = append(w.Levels, lv)
	fmt.Fprintf(o.Log, "pressure: %s at %.0f%%: %d blocks per engine, placement reference %.3f, pooled LRU %.3f, round-robin LRU %.3f\n",
		w.Workload.Name, 100*capacity, lv.NumBlocks, lv.PlacementHitRate, lv.PooledHitRate, lv.RoundRobinHitRate)
	return lv
}

// logCell writes one progress line for a cell.
func logCell(o *Options, c *Cell) {
	switch {
	case c.Unavailable != "":
		fmt.Fprintf(o.Log, "pressure: %-16s %3.0f%% %-19s %s\n", c.Workload, 100*c.Capacity, c.Strategy, c.Unavailable)
	case c.Error != "":
		fmt.Fprintf(o.Log, "pressure: %-16s %3.0f%% %-19s error: %s\n", c.Workload, 100*c.Capacity, c.Strategy, c.Error)
	default:
		fmt.Fprintf(o.Log, "pressure: %-16s %3.0f%% %-19s hit %.3f (placement %.3f, ∞ %.3f) ttft p50 %.0f p99 %.0f ms, %.0f req/s, busiest/idlest %s, failed %d (%.0fs)\n",
			c.Workload, 100*c.Capacity, c.Strategy, c.HitRate, c.PlacementHitRate, c.OracleHitRate, c.TTFT.P50, c.TTFT.P99,
			c.Throughput, loadtest.FormatMaxMin(c.Load.BusiestIdlest), c.Failed+c.Cancelled, c.Seconds)
	}
}

// planReferences returns the placement reference, the pooled LRU and the round-robin LRU over p in plan
// order.
func planReferences(p *loadtest.Plan, engines, numBlocks, blockSize int, epsilon float64) (placement, pooled, roundRobin float64) {
	po := NewPlacementOracle(engines, numBlocks, blockSize, epsilon)
	rr := NewPlacementOracle(engines, numBlocks, blockSize, epsilon)
	lru := loadtest.NewCapacityOracle(blockSize, engines*numBlocks)
	var tokens []uint32
	for i := range p.Requests {
		tokens = appendTokens(tokens[:0], p.Requests[i].Messages)
		po.Add(tokens)
		rr.AddTo(i%engines, tokens)
		lru.AddTokens(tokens)
	}
	return po.HitRate(), lru.HitRate(), rr.HitRate()
}

// runCell measures one strategy on a fresh fleet of engines configured by sc.
func runCell(ctx context.Context, o *Options, sc sim.Config, info *WorkloadInfo, plan *loadtest.Plan,
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
	samples, err := c.load(ctx, o, f, sc, plan, spec.Strategy == "precise_cache_aware")
	if err != nil {
		c.Error = err.Error()
		return c
	}
	c.readSamples(o, sc, info, samples, f.Names)
	return c
}

// load sends plan through fleet f and fills c with what the client, the engines and the gateway
// counted; it returns the samples, for readSamples.
func (c *Cell) load(ctx context.Context, o *Options, f *fleet.Fleet, sc sim.Config, plan *loadtest.Plan, precise bool) ([]loadtest.Sample, error) {
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
		return nil, err
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
	return res.Samples, nil
}

// readSamples fills what c's samples show: the placement reference over the send order, the load
// spread (and the burst's), the claims, the tokens per decision and the groups split over engines.
func (c *Cell) readSamples(o *Options, sc sim.Config, info *WorkloadInfo, smp []loadtest.Sample, names []string) {
	// Samples in send order: the placement reference replays them as they were sent.
	sort.Slice(smp, func(i, j int) bool { return smp[i].Index < smp[j].Index })
	po := NewPlacementOracle(o.Engines, sc.NumBlocks, sc.BlockSize, o.Epsilon)
	var tokens []uint32
	for i := range smp {
		tokens = appendTokens(tokens[:0], smp[i].Prompt)
		po.Add(tokens)
	}
	c.PlacementHitRate = po.HitRate()
	c.Load = loadSpread(smp, names)
	if info.Workload.Name == HotBurst {
		c.Burst = burstSpread(smp, info.Workload.hotGroup(), names)
	}
	c.Claims = claimStats(smp)
	c.ByDecision = byDecision(smp)
	c.GroupsSplit, c.EnginesPerGroup = fleet.GroupSpread(smp)
}
