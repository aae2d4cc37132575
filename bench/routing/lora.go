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

// The many-adapter comparison: one base model's replicas serving many LoRA adapters of Zipf popularity,
// each replica with a few adapter slots (vLLM's max_loras) and a load delay for an adapter not in one. What
// it shows is how often each router makes the replicas load adapters, and what that costs in TTFT.

// LoRAFleet is one router of the comparison.
type LoRAFleet struct {
	Name     string `json:"name"`
	Strategy string `json:"strategy"`
	// Aware routes the adapters with [routes.lora] (home sets); otherwise each adapter is a route of its
	// own over every replica.
	Aware bool `json:"aware"`
}

// LoRAFleets are the routers compared, in report order.
var LoRAFleets = []LoRAFleet{
	{Name: "adapter-aware", Strategy: "cache_aware", Aware: true},
	{Name: "round-robin", Strategy: "round_robin"},
	{Name: "least-load", Strategy: "least_load"},
	{Name: "cache-aware", Strategy: "cache_aware"},
}

// LoRAWorkload is one many-adapter workload: adapters of Zipf popularity, each with its own system prompt.
type LoRAWorkload struct {
	Name       string  `json:"name"`
	Adapters   int     `json:"adapters"`
	ZipfS      float64 `json:"zipf_s"`
	PerAdapter int     `json:"requests_per_adapter"` // on average: Adapters x PerAdapter requests in all
	System     int     `json:"system_tokens"`
	Question   int     `json:"question_tokens"`
	Output     int     `json:"output_tokens"`
	// About says where the popularity comes from.
	About string `json:"about"`
}

// Requests is the workload's number of requests.
func (w LoRAWorkload) Requests() int { return w.Adapters * w.PerAdapter }

// LoRAWorkloads are the workloads compared: the skewed popularity of Punica's evaluation (Zipf 1.5), and a
// longer tail (Zipf 1.1) where many adapters are each used now and then.
var LoRAWorkloads = []LoRAWorkload{
	{Name: "skewed", Adapters: 64, ZipfS: 1.5, PerAdapter: 32, System: 256, Question: 32, Output: 32,
		About: "Zipf 1.5, the skewed adapter popularity of Punica's evaluation"},
	{Name: "long-tail", Adapters: 64, ZipfS: 1.1, PerAdapter: 32, System: 256, Question: 32, Output: 32,
		About: "Zipf 1.1: a long tail of adapters each used now and then"},
}

// The engines of the comparison.
const (
	loraSlots     = 4 // max_loras
	loraLoadDelay = 50 * time.Millisecond
	loraLoadsPerK = 1000.0
)

// LoRAReport is the many-adapter comparison of the routing report.
type LoRAReport struct {
	Fleets      []LoRAFleet    `json:"fleets"`
	Workloads   []LoRAWorkload `json:"workloads"`
	MaxLoRAs    int            `json:"max_loras"`
	LoadDelay   string         `json:"load_delay"`
	Concurrency int            `json:"concurrency"`
	Trials      []*LoRATrial   `json:"trials"`
	Seconds     float64        `json:"seconds"`
}

// LoRATrial is one (fleet, repeat) measurement.
type LoRATrial struct {
	Workload string           `json:"workload"`
	Fleet    string           `json:"fleet"`
	Repeat   int              `json:"repeat"`
	Seed     uint64           `json:"seed"`
	Error    string           `json:"error,omitempty"`
	Result   *loadtest.Result `json:"result,omitempty"`
	// The engines' own counters: adapter loads into a slot and evictions, prefix-cache hits, requests.
	Loads          uint64 `json:"adapter_loads"`
	Evictions      uint64 `json:"adapter_evictions"`
	HitTokens      uint64 `json:"engine_hit_tokens"`
	QueriedTokens  uint64 `json:"engine_queried_tokens"`
	Requests       uint64 `json:"engine_requests"`
	EngineRequests []int  `json:"engine_requests_each"`
	// Fewest is the fewest adapter loads any router could have made for the run's requests (beladyLoads
	// over the fleet's slots pooled).
	Fewest  uint64  `json:"fewest_loads"`
	Planned int     `json:"planned_requests"`
	Seconds float64 `json:"seconds"`
}

// FewestPerK is Fewest per 1,000 requests of the plan.
func (t *LoRATrial) FewestPerK() float64 {
	if t.Planned == 0 {
		return 0
	}
	return loraLoadsPerK * float64(t.Fewest) / float64(t.Planned)
}

// LoadsPerK is the adapter loads per 1,000 requests the engines served.
func (t *LoRATrial) LoadsPerK() float64 {
	if t.Requests == 0 {
		return 0
	}
	return loraLoadsPerK * float64(t.Loads) / float64(t.Requests)
}

// HitRate is the engines' prefix-cache hit rate by their own counters.
func (t *LoRATrial) HitRate() float64 {
	if t.QueriedTokens == 0 {
		return 0
	}
	return float64(t.HitTokens) / float64(t.QueriedTokens)
}

func (t *LoRATrial) ok() bool { return t.Error == "" && t.Result != nil }

// LoRANames are the adapters' names.
func LoRANames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("adapter-%02d", i)
	}
	return names
}

// loraPlan is workload w's plan: each adapter's requests share its system prompt (its group of a Zipf
// shared-prefix workload) and name the adapter.
func loraPlan(o *Options, w LoRAWorkload, repeat int) (*loadtest.Plan, error) {
	lw := loadtest.Workload{Scenario: loadtest.SharedPrefix, Seed: o.Seed + uint64(repeat), Groups: w.Adapters,
		PromptsPerGroup: w.PerAdapter, Popularity: loadtest.Zipf, ZipfS: w.ZipfS,
		SystemTokens: w.System, QuestionTokens: w.Question, OutputTokens: w.Output}
	p, err := lw.Generate()
	if err != nil {
		return nil, err
	}
	names := LoRANames(w.Adapters)
	for i := range p.Requests {
		p.Requests[i].Model = names[p.Requests[i].Group]
	}
	return p, nil
}

// runLoRA runs every fleet of the comparison on every workload o.Repeats times, the list repeated rather
// than each fleet back to back.
func runLoRA(ctx context.Context, o *Options, log *slog.Logger) *LoRAReport {
	start := time.Now()
	d := &LoRAReport{Fleets: LoRAFleets, Workloads: o.LoRAWorkloads, MaxLoRAs: loraSlots, LoadDelay: loraLoadDelay.String(),
		Concurrency: o.Concurrency}
	sc := o.SimConfig()
	sc.MaxLoRAs, sc.LoRALoadDelay = loraSlots, loraLoadDelay
	for _, w := range d.Workloads {
		for repeat := 0; repeat < o.Repeats; repeat++ {
			for _, fl := range d.Fleets {
				if ctx.Err() != nil {
					d.Seconds = time.Since(start).Seconds()
					return d
				}
				t := runLoRAOne(ctx, o, sc, w, fl, repeat, log)
				d.Trials = append(d.Trials, t)
				if t.Error != "" {
					fmt.Fprintf(o.Log, "routing: lora %s #%d %-14s error: %s\n", w.Name, repeat+1, fl.Name, t.Error)
					continue
				}
				r := t.Result
				fmt.Fprintf(o.Log, "routing: lora %s #%d %-14s loads/1k %.1f (fewest %.1f) hit %.3f ttft p50 %.1fms p90 %.1fms %.1f req/s errors %d (%.0fs)\n",
					w.Name, repeat+1, fl.Name, t.LoadsPerK(), t.FewestPerK(), t.HitRate(), r.TTFT.P50, r.TTFT.P90, r.Throughput, r.Failed+r.Cancelled, t.Seconds)
			}
		}
	}
	d.Seconds = time.Since(start).Seconds()
	return d
}

// runLoRAOne measures one fleet from cold engines: no adapter in a slot, empty caches.
func runLoRAOne(ctx context.Context, o *Options, sc sim.Config, w LoRAWorkload, fl LoRAFleet, repeat int, log *slog.Logger) *LoRATrial {
	t := &LoRATrial{Workload: w.Name, Fleet: fl.Name, Repeat: repeat, Seed: o.Seed + uint64(repeat)}
	start := time.Now()
	defer func() { t.Seconds = time.Since(start).Seconds() }()
	plan, err := loraPlan(o, w, repeat)
	if err != nil {
		t.Error = err.Error()
		return t
	}
	seq := make([]int, len(plan.Requests))
	for i, r := range plan.Requests {
		seq[i] = r.Group
	}
	t.Fewest, t.Planned = uint64(beladyLoads(seq, o.Engines*sc.MaxLoRAs)), len(seq)
	f, err := fleet.StartLoRA(o.Engines, sc, LoRANames(w.Adapters), fl.Strategy, fl.Aware, o.LoRAParams, log)
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
	res, err := loadtest.Run(ctx, loadtest.Options{
		URL:         f.URL,
		Plan:        plan,
		Concurrency: o.Concurrency,
		Duration:    o.RunTimeout,
		Timeout:     time.Minute,
		Targets:     f.Names,
		BlockSize:   sc.BlockSize,
	})
	if err != nil {
		t.Error = err.Error()
		return t
	}
	for _, e := range f.Sims {
		st := e.Stats()
		t.Loads += st.LoRALoads
		t.Evictions += st.LoRAEvictions
		t.HitTokens += st.HitTokens
		t.QueriedTokens += st.QueriedTokens
		t.Requests += st.Requests
		t.EngineRequests = append(t.EngineRequests, int(st.Requests))
	}
	t.Result = res
	return t
}

// RunLoRA runs the many-adapter comparison alone into rep (a report loaded from its JSON) and evaluates the
// goals again; it returns an error only when ctx ends.
func RunLoRA(ctx context.Context, rep *Report, o Options) error {
	o.Normalize()
	log := slog.New(slog.NewTextHandler(o.Log, &slog.HandlerOptions{Level: slog.LevelError}))
	rep.LoRA = runLoRA(ctx, &o, log)
	rep.Goals = goalsOf(rep)
	return ctx.Err()
}

// cells returns the trials of a (workload, fleet) that measured something.
func (d *LoRAReport) cells(w, fl string) []*LoRATrial {
	var out []*LoRATrial
	for _, t := range d.Trials {
		if t.Workload == w && t.Fleet == fl && t.ok() {
			out = append(out, t)
		}
	}
	return out
}

// Run returns the representative trial of a fleet on workload w: the repeat with the median loads per 1,000
// requests, or nil when none measured anything.
func (d *LoRAReport) Run(w, fl string) *LoRATrial {
	return middle(d.cells(w, fl), (*LoRATrial).LoadsPerK)
}

// median returns the median of f over the trials of a fleet on workload w that measured something.
func (d *LoRAReport) median(w, fl string, f func(*LoRATrial) float64) (float64, int) {
	return medianOf(d.cells(w, fl), f)
}

// goals, on each workload: adapter-aware routing loads adapters at least 5x less often than round robin,
// at equal or better TTFT p90 (medians over repeats).
func (d *LoRAReport) goals(g *fleet.Goals) {
	if d == nil {
		return
	}
	loads := func(t *LoRATrial) float64 { return t.LoadsPerK() }
	fewest := func(t *LoRATrial) float64 { return t.FewestPerK() }
	p90 := func(t *LoRATrial) float64 { return t.Result.TTFT.P90 }
	for _, w := range d.Workloads {
		nameL := fmt.Sprintf("lora (%s): adapter loads per 1k requests, round robin / adapter-aware", w.Name)
		nameT := fmt.Sprintf("lora (%s): TTFT p90, adapter-aware / round robin", w.Name)
		al, n1 := d.median(w.Name, "adapter-aware", loads)
		rl, n2 := d.median(w.Name, "round-robin", loads)
		if n1 == 0 || n2 == 0 {
			g.NA(nameL, ">= 5x", "not run")
			g.NA(nameT, "<= 1.0x", "not run")
			continue
		}
		fw, _ := d.median(w.Name, "adapter-aware", fewest)
		g.Add(nameL, ">= 5x", fmt.Sprintf("%.1fx (%.1f / %.1f, medians over %d and %d runs; fewest possible %.1f)",
			rl/max(al, 1e-9), rl, al, n2, n1, fw), rl >= 5*al)
		at, _ := d.median(w.Name, "adapter-aware", p90)
		rt, _ := d.median(w.Name, "round-robin", p90)
		g.Add(nameT, "<= 1.0x", fmt.Sprintf("%.2fx (%.1f / %.1f ms)", at/max(rt, 1e-9), at, rt), at <= rt)
	}
}

// markdown writes the section of the comparison.
func (d *LoRAReport) markdown(b *strings.Builder, o ReportOptions) {
	if d == nil || len(d.Trials) == 0 {
		return
	}
	b.WriteString("\n## Many LoRA adapters\n\n")
	fmt.Fprintf(b, "%d engines of one base model, each registering every adapter (`--lora-modules`) with %d adapter slots "+
		"(`max_loras`): an adapter not in a slot takes a free one or evicts the least recently used idle one and loads in %s "+
		"before its prefill, and waits while every slot's adapter is running (docs/simulator.md). The engines otherwise as above "+
		"(%d blocks, `max_num_seqs` %d, prefill %s per uncached token, decode %s per token). "+
		"Each request names an adapter of Zipf popularity and carries the adapter's own system prompt; %d in flight, streaming, "+
		"a fresh fleet per run.\n\n",
		o.Engines, d.MaxLoRAs, d.LoadDelay, o.NumBlocks, o.MaxNumSeqs, o.PrefillPerToken, o.DecodePerToken, d.Concurrency)
	b.WriteString("- **adapter-aware**: one route with `[routes.lora]` naming the adapters (default home sets: 1 to 4 replicas, one per 8 requests in flight), `cache_aware` within each adapter's home set;\n")
	b.WriteString("- **round-robin**, **least-load**, **cache-aware**: each adapter a route of its own over every engine, as a gateway that knows adapters only as model names.\n\n")
	fmt.Fprintf(b, "Loads = the engines' own count of adapters loaded into a slot; hit = their prefix-cache counters. The repeat with the median loads, "+
		"its range in brackets. *Fewest possible* is what no router could beat on that run's requests: Belady's eviction over the fleet's "+
		"%d slots as one pool, knowing every request to come.\n", o.Engines*d.MaxLoRAs)
	for _, w := range d.Workloads {
		fmt.Fprintf(b, "\n### %s: %d adapters, %s\n\n", w.Name, w.Adapters, w.About)
		fmt.Fprintf(b, "%d requests, each with a %d-token system prompt of its adapter, a %d-token question and %d output tokens", w.Requests(), w.System, w.Question, w.Output)
		if t := d.Run(w.Name, d.Fleets[0].Name); t != nil {
			fmt.Fprintf(b, "; fewest possible: %.1f loads per 1,000 requests", t.FewestPerK())
		}
		b.WriteString(".\n\n")
		b.WriteString("| router | strategy | loads / 1k requests | evictions | hit rate | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | req/s | errors |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
		for _, fl := range d.Fleets {
			t := d.Run(w.Name, fl.Name)
			if t == nil {
				fmt.Fprintf(b, "| %s | %s | did not run | | | | | | | |\n", fl.Name, fl.Strategy)
				continue
			}
			r := t.Result
			lo, hi := d.loadsRange(w.Name, fl.Name)
			fmt.Fprintf(b, "| %s | %s | %.1f [%.1f–%.1f] | %d | %.3f | %.1f | %.1f | %.1f | %.1f | %d |\n",
				fl.Name, fl.Strategy, t.LoadsPerK(), lo, hi, t.Evictions, t.HitRate(), r.TTFT.P50, r.TTFT.P90, r.TTFT.P99,
				r.Throughput, r.Failed+r.Cancelled)
		}
	}
}

// loadsRange returns the lowest and highest loads per 1,000 requests over the repeats of a fleet on
// workload w.
func (d *LoRAReport) loadsRange(w, fl string) (lo, hi float64) {
	for i, t := range d.cells(w, fl) {
		v := t.LoadsPerK()
		if i == 0 || v < lo {
			lo = v
		}
		if i == 0 || v > hi {
			hi = v
		}
	}
	return lo, hi
}

// beladyLoads is the fewest adapter loads any router could make for the adapters of seq, in order, on a
// fleet of slots adapter slots in all: Belady's optimal eviction (the adapter used furthest in the future
// goes) on one pooled cache - a bound no placement on separate engines can beat.
func beladyLoads(seq []int, slots int) int {
	next := make([]int, len(seq)) // the index of the next use of seq[i]'s adapter, len(seq) if none
	last := map[int]int{}
	for i := len(seq) - 1; i >= 0; i-- {
		n, ok := last[seq[i]]
		if !ok {
			n = len(seq)
		}
		next[i], last[seq[i]] = n, i
	}
	held := map[int]int{} // adapter -> its next use
	loads := 0
	for i, a := range seq {
		if _, ok := held[a]; !ok {
			loads++
			if len(held) == slots {
				victim, far := -1, -1
				for b, n := range held {
					if n > far || n == far && b < victim {
						victim, far = b, n
					}
				}
				delete(held, victim)
			}
		}
		held[a] = next[i]
	}
	return loads
}

// LoRASeconds is how long the many-adapter comparison took, 0 when it did not run.
func (r *Report) LoRASeconds() float64 {
	if r.LoRA == nil {
		return 0
	}
	return r.LoRA.Seconds
}
