package routing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/loadtest"
	"github.com/rolter-ai/rolter/sim"
)

// The disaggregated comparison: a prefill/decode-disaggregated fleet whose prefill pool is ranked by a
// cache strategy or by load, against an aggregated fleet of the same size, on the workloads with prefix
// reuse. What it shows is whether the prefill pool's ranking matters once a decode engine receives every
// prompt's blocks anyway: the prefill engine's prefix cache is where the reuse is.

// DisaggFleet is one fleet of the comparison.
type DisaggFleet struct {
	Name     string `json:"name"`
	Strategy string `json:"strategy"` // over the prefill pool, or over every engine when aggregated
	Prefill  int    `json:"prefill"`  // 0: aggregated
	Decode   int    `json:"decode"`   // or, aggregated, the number of engines
}

// DisaggFleets are the fleets compared, in report order: 2 prefill + 2 decode engines with cache_aware
// or least_load over the prefill pool, and 4 aggregated engines with cache_aware.
var DisaggFleets = []DisaggFleet{
	{Name: "prefill-by-cache", Strategy: "cache_aware", Prefill: 2, Decode: 2},
	{Name: "prefill-by-load", Strategy: "least_load", Prefill: 2, Decode: 2},
	{Name: "aggregated", Strategy: "cache_aware", Decode: 4},
}

// DisaggScenarios are the workloads of the comparison (those of Options.Scenarios among them run).
var DisaggScenarios = []string{loadtest.SharedPrefix, loadtest.MultiTurn}

// DisaggReport is the disaggregated comparison of the routing report.
type DisaggReport struct {
	Fleets           []DisaggFleet  `json:"fleets"`
	Scenarios        []string       `json:"scenarios"`
	Concurrency      int            `json:"concurrency"`
	TransferPerBlock string         `json:"transfer_per_block"`
	Trials           []*DisaggTrial `json:"trials"`
}

// DisaggTrial is one (scenario, fleet, repeat) measurement.
type DisaggTrial struct {
	Scenario string           `json:"scenario"`
	Fleet    string           `json:"fleet"`
	Repeat   int              `json:"repeat"`
	Seed     uint64           `json:"seed"`
	Error    string           `json:"error,omitempty"`
	Result   *loadtest.Result `json:"result,omitempty"`
	// ITL is each request's mean time between output tokens, (latency - TTFT) / (output tokens - 1)
	// (vLLM's TPOT), in ms.
	ITL loadtest.Dist `json:"itl_ms"`
	// The engines' own prefix-cache counters: the prefill pool's (every engine's when aggregated), and
	// the decode pool's local hits (blocks pulled from a prefill engine are not local hits).
	PrefillHitTokens uint64 `json:"prefill_hit_tokens"`
	PrefillQueried   uint64 `json:"prefill_queried_tokens"`
	DecodeHitTokens  uint64 `json:"decode_hit_tokens"`
	DecodeQueried    uint64 `json:"decode_queried_tokens"`
	// Hops: requests the prefill pool prefilled for a decode engine, requests the decode pool received,
	// blocks it pulled and pulls that failed.
	RemotePrefills uint64 `json:"remote_prefills"`
	DecodeRequests uint64 `json:"decode_requests"`
	BlocksPulled   uint64 `json:"blocks_pulled"`
	PullsFailed    uint64 `json:"pulls_failed"`
	// EngineRequests are the requests each engine received and Inflight their running + waiting
	// over time, the prefill pool first.
	EngineRequests []int                 `json:"engine_requests"`
	Inflight       fleet.InflightSummary `json:"inflight"`
	Seconds        float64               `json:"seconds"`
}

// PrefillHitRate is the prefill pool's prefix-cache hit rate by its own counters.
func (t *DisaggTrial) PrefillHitRate() float64 {
	if t.PrefillQueried == 0 {
		return 0
	}
	return float64(t.PrefillHitTokens) / float64(t.PrefillQueried)
}

func (t *DisaggTrial) ok() bool { return t.Error == "" && t.Result != nil }

// disaggDecodeSeqs is the decode engines' max_num_seqs as a multiple of the prefill engines'.
const disaggDecodeSeqs = 4

// runDisagg runs every fleet on every disaggregated scenario, o.Repeats times, the matrix repeated
// rather than each cell back to back.
func runDisagg(ctx context.Context, o *Options, log *slog.Logger) *DisaggReport {
	d := &DisaggReport{Fleets: DisaggFleets, Concurrency: o.DisaggConcurrency, TransferPerBlock: o.TransferPerBlock.String()}
	for _, sc := range DisaggScenarios {
		for _, want := range o.Scenarios {
			if sc == want {
				d.Scenarios = append(d.Scenarios, sc)
			}
		}
	}
	sc := o.SimConfig()
	sc.TransferPerBlock = o.TransferPerBlock
	for repeat := 0; repeat < o.Repeats; repeat++ {
		for _, scenario := range d.Scenarios {
			for _, fl := range d.Fleets {
				if ctx.Err() != nil {
					return d
				}
				t := runDisaggOne(ctx, o, sc, scenario, fl, repeat, log)
				d.Trials = append(d.Trials, t)
				if t.Error != "" {
					fmt.Fprintf(o.Log, "routing: disagg #%d %-13s %-16s error: %s\n", repeat+1, scenario, fl.Name, t.Error)
					continue
				}
				r := t.Result
				fmt.Fprintf(o.Log, "routing: disagg #%d %-13s %-16s prefill hit %.3f ttft p50 %.1fms p90 %.1fms itl p50 %.2fms %.1f req/s errors %d (%.0fs)\n",
					repeat+1, scenario, fl.Name, t.PrefillHitRate(), r.TTFT.P50, r.TTFT.P90, t.ITL.P50, r.Throughput, r.Failed+r.Cancelled, t.Seconds)
			}
		}
	}
	return d
}

// runDisaggOne measures one fleet on one scenario, from cold caches.
func runDisaggOne(ctx context.Context, o *Options, sc sim.Config, scenario string, fl DisaggFleet, repeat int, log *slog.Logger) *DisaggTrial {
	w := o.Workload(scenario, repeat)
	t := &DisaggTrial{Scenario: scenario, Fleet: fl.Name, Repeat: repeat, Seed: w.Seed}
	start := time.Now()
	defer func() { t.Seconds = time.Since(start).Seconds() }()
	var f *fleet.Fleet
	var err error
	if fl.Prefill > 0 {
		// A decode engine batches several times the sequences a prefill engine prefills at once (decode is
		// memory-bound, prefill compute-bound), and a decode pool of max_num_seqs each would hold fewer than
		// the requests in flight: the fleet would measure its decode queue, not its prefill pool. The prefill
		// pool holds the fleet's prompt cache, as much of it as the aggregated fleet's four engines do.
		f, err = fleet.StartDisagg(fl.Prefill, fl.Decode, sc, disaggDecodeSeqs*o.MaxNumSeqs,
			sc.NumBlocks*(fl.Prefill+fl.Decode)/fl.Prefill, fl.Strategy, "", log)
	} else {
		agg := sc
		agg.TransferPerBlock = 0
		f, err = fleet.Start(fl.Decode, agg, fl.Strategy, log)
	}
	if err != nil {
		var ue *fleet.UnavailableError
		if errors.As(err, &ue) {
			t.Error = "not available in this build: " + ue.Reason
		} else {
			t.Error = err.Error()
		}
		return t
	}
	defer f.Stop()
	sampler := fleet.StartSampler(f.Sims, 20*time.Millisecond)
	res, err := loadtest.Run(ctx, loadtest.Options{
		URL:         f.URL,
		Workload:    w,
		Concurrency: o.DisaggConcurrency,
		Duration:    o.RunTimeout,
		Timeout:     time.Minute,
		Targets:     f.Names,
		BlockSize:   sc.BlockSize,
		KeepSamples: true,
	})
	samples := sampler.Stop()
	if err != nil {
		t.Error = err.Error()
		return t
	}
	t.ITL = itlOf(res.Samples)
	t.Inflight = fleet.SummarizeInflight(samples, len(f.Sims))
	for i, e := range f.Sims {
		st := e.Stats()
		t.EngineRequests = append(t.EngineRequests, int(st.Requests))
		if i < f.Prefill || f.Prefill == 0 {
			t.PrefillHitTokens += st.HitTokens
			t.PrefillQueried += st.QueriedTokens
			t.RemotePrefills += st.RemotePrefills
			continue
		}
		t.DecodeHitTokens += st.HitTokens
		t.DecodeQueried += st.QueriedTokens
		t.DecodeRequests += st.Requests
		t.BlocksPulled += st.BlocksReceived
		t.PullsFailed += st.PullsFailed
	}
	res.Samples = nil
	t.Result = res
	return t
}

// itlOf returns the distribution of the succeeded requests' mean inter-token times, in ms.
func itlOf(samples []loadtest.Sample) loadtest.Dist {
	var vs []float64
	for _, s := range samples {
		if s.Status == 200 && s.Error == "" && s.OutputTokens > 1 {
			vs = append(vs, (s.LatencyMs-s.TTFTMs)/float64(s.OutputTokens-1))
		}
	}
	return loadtest.NewDist(vs)
}

// cells returns the trials of a (scenario, fleet) that measured something.
func (d *DisaggReport) cells(scenario, fl string) []*DisaggTrial {
	var out []*DisaggTrial
	for _, t := range d.Trials {
		if t.Scenario == scenario && t.Fleet == fl && t.ok() {
			out = append(out, t)
		}
	}
	return out
}

// Run returns the representative trial of a (scenario, fleet): the repeat with the median prefill hit
// rate (the lower middle for an even count), or nil when none measured anything.
func (d *DisaggReport) Run(scenario, fl string) *DisaggTrial {
	return middle(d.cells(scenario, fl), (*DisaggTrial).PrefillHitRate)
}

// median returns the median of f over the trials of a (scenario, fleet) that measured something.
func (d *DisaggReport) median(scenario, fl string, f func(*DisaggTrial) float64) (float64, int) {
	return medianOf(d.cells(scenario, fl), f)
}

// goals: on every scenario, the prefill pool ranked by cache beats it ranked by load on TTFT p50 and on
// the prefill engines' hit rate (medians over repeats).
func (d *DisaggReport) goals(g *fleet.Goals) {
	if d == nil {
		return
	}
	ttft := func(t *DisaggTrial) float64 { return t.Result.TTFT.P50 }
	hit := func(t *DisaggTrial) float64 { return t.PrefillHitRate() }
	for _, sc := range d.Scenarios {
		nameT := "disaggregated: prefill-by-cache TTFT p50 < prefill-by-load's (" + sc + ")"
		nameH := "disaggregated: prefill-by-cache prefill hit rate > prefill-by-load's (" + sc + ")"
		ct, n1 := d.median(sc, "prefill-by-cache", ttft)
		lt, n2 := d.median(sc, "prefill-by-load", ttft)
		if n1 == 0 || n2 == 0 {
			g.NA(nameT, "< 1.0x", "a fleet did not run")
			g.NA(nameH, "> 1.0x", "a fleet did not run")
			continue
		}
		ch, _ := d.median(sc, "prefill-by-cache", hit)
		lh, _ := d.median(sc, "prefill-by-load", hit)
		g.Add(nameT, "< 1.0x", fmt.Sprintf("%.2fx (%.1f / %.1f ms, medians over %d and %d runs)", ct/lt, ct, lt, n1, n2), ct < lt)
		g.Add(nameH, "> 1.0x", fmt.Sprintf("%.2fx (%.3f / %.3f)", ch/max(lh, 1e-9), ch, lh), ch > lh)
	}
}

// markdown writes the section of the comparison.
func (d *DisaggReport) markdown(b *strings.Builder, o ReportOptions) {
	if d == nil || len(d.Trials) == 0 {
		return
	}
	b.WriteString("\n## Disaggregated prefill/decode\n\n")
	fmt.Fprintf(b, "Same engines as above (%d blocks, `max_num_seqs` %d, prefill %s per uncached token, decode %s per token), "+
		"four of them per fleet, %d requests in flight (3/4 of four engines' slots), streaming, fresh fleet per run; "+
		"the decode engines of a disaggregated fleet run %d sequences at once, as decode engines batch several times what a "+
		"prefill engine prefills at once (with %d, the decode pool would hold fewer than the requests in flight and the "+
		"comparison would measure its queue), and its prefill engines hold the fleet's prompt cache, twice the blocks "+
		"each, so that both kinds of fleet have the same prompt-cache capacity:\n\n",
		o.NumBlocks, o.MaxNumSeqs, o.PrefillPerToken, o.DecodePerToken, d.Concurrency, disaggDecodeSeqs*o.MaxNumSeqs, o.MaxNumSeqs)
	b.WriteString("- **prefill-by-cache**: one disaggregated route (`rolter up -pd 2:2`'s shape), 2 prefill + 2 decode engines, `cache_aware` over the prefill pool, the decode pool by least load;\n")
	b.WriteString("- **prefill-by-load**: the same fleet with `least_load` over the prefill pool;\n")
	b.WriteString("- **aggregated**: 4 ordinary engines, `cache_aware`.\n\n")
	fmt.Fprintf(b, "A block pull costs %s per 16-token block: a Llama-3-8B block (16 tokens × 128 KiB of K and V in bf16 = 2 MiB) "+
		"moves over RDMA at some 20-40 GB/s in 50-100 µs, against 16 × %s = %s to compute it, so a pull costs "+
		"about what one token of prefill does - the ratio of the simulator's own defaults (20 µs per block, 20 µs per token). "+
		"`prefill_threshold_tokens` is the default (0): every request takes the prefill hop.\n\n",
		d.TransferPerBlock, o.PrefillPerToken, blockCost(o.PrefillPerToken))
	b.WriteString("Prefill hit = the prefill engines' own prefix-cache counters (every engine's when aggregated); ITL = each request's (latency − TTFT) / (output tokens − 1). The repeat with the median prefill hit rate, its range in brackets:\n")
	for _, sc := range d.Scenarios {
		fmt.Fprintf(b, "\n### %s\n\n", sc)
		b.WriteString("| fleet | strategy | prefill hit | client cached/prompt | TTFT mean ms | TTFT p50 ms | TTFT p90 ms | ITL p50 ms | ITL p90 ms | req/s | decode local hit | blocks pulled | errors |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, fl := range d.Fleets {
			t := d.Run(sc, fl.Name)
			if t == nil {
				fmt.Fprintf(b, "| %s | %s | did not run | | | | | | | | | | |\n", fl.Name, fl.Strategy)
				continue
			}
			r := t.Result
			lo, hi := d.hitRange(sc, fl.Name)
			decodeHit := "-"
			if fl.Prefill > 0 && t.DecodeQueried > 0 {
				decodeHit = fmt.Sprintf("%.3f", float64(t.DecodeHitTokens)/float64(t.DecodeQueried))
			}
			fmt.Fprintf(b, "| %s | %s | %.3f [%.3f–%.3f] | %.3f | %.1f | %.1f | %.1f | %.2f | %.2f | %.1f | %s | %d | %d |\n",
				fl.Name, fl.Strategy, t.PrefillHitRate(), lo, hi, r.HitRate, r.TTFT.Mean, r.TTFT.P50, r.TTFT.P90, t.ITL.P50, t.ITL.P90,
				r.Throughput, decodeHit, t.BlocksPulled, r.Failed+r.Cancelled)
		}
	}
}

// hitRange returns the lowest and highest prefill hit rate over the repeats of a cell.
func (d *DisaggReport) hitRange(scenario, fl string) (lo, hi float64) {
	for i, t := range d.cells(scenario, fl) {
		h := t.PrefillHitRate()
		if i == 0 || h < lo {
			lo = h
		}
		if i == 0 || h > hi {
			hi = h
		}
	}
	return lo, hi
}

// blockCost renders 16 tokens' prefill time.
func blockCost(perToken string) string {
	d, err := time.ParseDuration(perToken)
	if err != nil {
		return "?"
	}
	return (16 * d).String()
}
