package pressure

import (
	"io"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
)

// Strategies are the report's rows: every strategy of the routing report, and the recommended one without
// its load bound, so the report shows what the bound costs.
var Strategies = append(append([]string(nil), fleet.Strategies...), Recommended+":load_bound=0")

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
	// Strategies to compare (Strategies). An entry may carry route parameters,
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
		o.Strategies = Strategies
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
