package pressure

import (
	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/loadtest"
)

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
func (c *Cell) VsOracle() float64 { return div(c.HitRate, c.OracleHitRate) }

// VsPlacement is HitRate over the capacity-aware placement reference (0 when it is 0).
func (c *Cell) VsPlacement() float64 { return div(c.HitRate, c.PlacementHitRate) }

// div is a / b, 0 when b is not positive (a reference that measured nothing).
func div(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
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
