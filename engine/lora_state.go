package engine

import (
	"time"

	"github.com/rolter-ai/rolter/telemetry"
)

// LoRAState is what an adapter route adds to its state: where the adapter is placed.
type LoRAState struct {
	Adapter string `json:"adapter"`
	Base    string `json:"base"` // the model of the route that names it
	// Order is every replica (provider) in the adapter's rendezvous order, the same on every gateway; the
	// home set is its first K, replicas that hold the adapter first.
	Order []string `json:"order"`
	K     int      `json:"k"`
	KMin  int      `json:"k_min"`
	KMax  int      `json:"k_max"`
	// Home is the home set a request would get now; Holders the replicas that hold the adapter (it runs
	// there, or this gateway has or recently had its requests there).
	Home     []string `json:"home"`
	Holders  []string `json:"holders"`
	Inflight int64    `json:"inflight"`
	// Dynamic says the gateway loads the adapter where a replica lacks it; Loads and LoadFailures count
	// those loads since the gateway started.
	Dynamic      bool   `json:"dynamic"`
	Loads        uint64 `json:"loads"`
	LoadFailures uint64 `json:"load_failures"`
}

// AdapterState is what an engine reports of its LoRA adapters ([metrics_scrape]): those /v1/models lists
// (registered, with their base model as parent), and those vllm:lora_requests_info says run and wait, with
// its adapter slots (max_lora). Absent fields are unknown or stale.
type AdapterState struct {
	Registered []string `json:"registered,omitempty"`
	Running    []string `json:"running,omitempty"`
	Waiting    []string `json:"waiting,omitempty"`
	MaxLoRA    *int     `json:"max_lora,omitempty"`
}

// loraState is the placement of an adapter route's adapter at now.
func loraState(r *Route, now int64) *LoRAState {
	lr := r.lora
	ls := &LoRAState{Adapter: lr.adapter, Base: lr.base, K: lr.current(now), KMin: lr.kMin, KMax: lr.kMax,
		Inflight: lr.live.inflight.Load(), Dynamic: lr.dynamic, Order: []string{}, Home: []string{}, Holders: []string{}}
	for _, i := range lr.order {
		ls.Order = append(ls.Order, r.Targets[i].Provider.Name)
	}
	for i, t := range r.Targets {
		if lr.holds(t, i, now) {
			ls.Holders = append(ls.Holders, t.Provider.Name)
		}
		ls.Loads += lr.targets[i].load.loads.Load()
		ls.LoadFailures += lr.targets[i].load.failures.Load()
	}
	for _, i := range lr.preview(r, now) {
		ls.Home = append(ls.Home, r.Targets[i].Provider.Name)
	}
	return ls
}

// registerLoRAMetrics registers the series of adapter route r in set.
func registerLoRAMetrics(set *telemetry.Set, r *Route) {
	lr := r.lora
	l := "route=" + telemetry.Label(r.Model)
	set.Gauge(telemetry.LoRAHomeReplicas, l, func() float64 { return float64(lr.live.k.Load()) })
	set.Gauge(telemetry.LoRAInflight, l, func() float64 { return float64(lr.live.inflight.Load()) })
	set.Gauge(telemetry.LoRAHolders, l, func() float64 {
		now, n := time.Now().UnixNano(), 0
		for i, t := range r.Targets {
			if lr.holds(t, i, now) {
				n++
			}
		}
		return float64(n)
	})
	sum := func(f func(ld *loader) uint64) func() uint64 {
		return func() uint64 {
			var n uint64
			for _, st := range lr.targets {
				n += f(&st.load)
			}
			return n
		}
	}
	set.CounterFunc(telemetry.LoRALoads, l+`,result="ok"`, sum(func(ld *loader) uint64 { return ld.loads.Load() }))
	set.CounterFunc(telemetry.LoRALoads, l+`,result="failed"`, sum(func(ld *loader) uint64 { return ld.failures.Load() }))
}
