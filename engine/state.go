package engine

import (
	"math"
	"time"

	"github.com/rolter-ai/rolter/config"
)

// State is a read-only view of the live snapshot, for the control plane (GET /api/v1/state) and the
// dashboard: per route and target what routing sees right now.
type State struct {
	Generation uint64       `json:"generation"`
	Routes     []RouteState `json:"routes"`
}

// RouteState is one route.
type RouteState struct {
	Model     string            `json:"model"`
	Strategy  string            `json:"strategy"`
	Org       string            `json:"org,omitempty"`
	Decisions map[string]uint64 `json:"decisions"` // since the route's series began, by reason
	Targets   []TargetState     `json:"targets"`
	// Shadows are the route's shadow strategies ([routes.shadow]); ShadowDropped the requests they had no
	// room for.
	Shadows       []ShadowState `json:"shadows,omitempty"`
	ShadowDropped uint64        `json:"shadow_dropped,omitempty"`
	// Disaggregation is the decode pool and protocol of a prefill/decode-disaggregated route
	// ([routes.disaggregation]), whose Targets are then its prefill pool; absent for a route whose targets
	// serve requests whole.
	Disaggregation *DisaggState `json:"disaggregation,omitempty"`
	// LoRA is where an adapter's route places it ([routes.lora] makes one route per adapter); absent for other
	// routes.
	LoRA *LoRAState `json:"lora,omitempty"`
}

// DisaggState is what a disaggregated route adds to its state: how its two pools are paired, its decode
// pool, and what became of the requests' two hops.
type DisaggState struct {
	Protocol string `json:"protocol"` // "vllm" or "sglang"
	// PrefillThresholdTokens is the prompt length, in tokens, below which a request skips the prefill pool.
	PrefillThresholdTokens int `json:"prefill_threshold_tokens"`
	// BootstrapPort is the prefill engines' bootstrap port sent to SGLang (0: null); absent for vllm.
	BootstrapPort *int `json:"bootstrap_port,omitempty"`
	// Decode is the decode pool, each target as the prefill pool's in Targets (no trie nor evidence: the
	// decode pool is chosen by load, not by prefix).
	Decode []TargetState `json:"decode"`
	// Hops counts the prefill and decode hops by outcome (rolter_disagg_hops_total), Reprefills the fresh
	// prefills after a decode engine failed with the blocks (rolter_disagg_reprefills_total), since the
	// route's series began.
	Hops       DisaggHops `json:"hops"`
	Reprefills uint64     `json:"reprefills"`
	// KVParams counts the prefill answers by what their kv_transfer_params were (received, absent,
	// invalid), Skipped the requests sent to a decode engine alone by reason (short_prompt, endpoint,
	// prefill_failed); reasons and results not seen yet are left out.
	KVParams map[string]uint64 `json:"kv_params"`
	Skipped  map[string]uint64 `json:"skipped"`
}

// DisaggHops are a disaggregated route's hops by kind and outcome.
type DisaggHops struct {
	PrefillOK     uint64 `json:"prefill_ok"`
	PrefillFailed uint64 `json:"prefill_failed"`
	DecodeOK      uint64 `json:"decode_ok"`
	DecodeFailed  uint64 `json:"decode_failed"`
}

// ShadowState is one shadow strategy of a route: what it would have done, in its own counterfactual state.
type ShadowState struct {
	Strategy string `json:"strategy"`
	// Ranked requests; Succeeded of them ended 2xx, Agreed of those went to the target the shadow picked.
	Ranked    uint64 `json:"ranked"`
	Succeeded uint64 `json:"succeeded"`
	Agreed    uint64 `json:"agreed"`
	// Its predicted reuse (as a target's reuse_* fields) and the load spread its picks would have made.
	Reuse   Reuse    `json:"reuse"`
	LoadCoV *float64 `json:"load_cov,omitempty"`
}

// Reuse is predicted prompt reuse in the strategy's unit (key bytes, or tokens for precise_cache_aware):
// the prompts' size (Scored), the best match over the eligible targets (Held) and the chosen target's
// (Captured). Captured/Held is routing quality; Captured/Scored beside a target's CachedTokens/PromptTokens
// is index accuracy.
type Reuse struct {
	Scored   uint64 `json:"scored"`
	Held     uint64 `json:"held"`
	Captured uint64 `json:"captured"`
}

// TargetState is one target of a route.
type TargetState struct {
	Provider string  `json:"provider"`
	Model    string  `json:"model"`
	Weight   float64 `json:"weight"`
	Inflight int64   `json:"inflight"`
	// Requests counts the requests the target finished, since the route's series began (a dashboard
	// plots its rate).
	Requests uint64 `json:"requests"`
	// EngineRunning and EngineWaiting are the engine's own queue from its /metrics ([metrics_scrape]);
	// absent when unknown or stale.
	EngineRunning *int64 `json:"engine_running,omitempty"`
	EngineWaiting *int64 `json:"engine_waiting,omitempty"`
	Eligible      bool   `json:"eligible"`
	// Why says what keeps an ineligible target out: "unhealthy", "cooling down", "breaker open",
	// "breaker half-open".
	Why string `json:"why,omitempty"`
	// TrieNodes and TriePromptBytes are the target's prefix trie (cache_aware, pipeline).
	TrieNodes       *int `json:"trie_nodes,omitempty"`
	TriePromptBytes *int `json:"trie_edge_bytes,omitempty"`
	// KVBlocks, KVTrusted and KVReason are its KV-event index (precise_cache_aware).
	KVBlocks  *int   `json:"kv_blocks,omitempty"`
	KVTrusted *bool  `json:"kv_trusted,omitempty"`
	KVReason  string `json:"kv_reason,omitempty"`

	// Delivered reuse, from the engines' own usage: the 2xx responses that reported prompt and cached
	// tokens (Measured; the others are Unmeasured, not zero reuse) and their token sums.
	Measured     uint64 `json:"usage_measured"`
	Unmeasured   uint64 `json:"usage_unmeasured"`
	PromptTokens uint64 `json:"prompt_tokens"`
	CachedTokens uint64 `json:"cached_tokens"`
	// Predicted reuse over the same measured responses, and the recent gap between the predicted and the
	// delivered fraction (absent until measured): a gap that grows says the index went stale.
	Reuse    Reuse    `json:"reuse"`
	ReuseGap *float64 `json:"reuse_gap,omitempty"`
	// Evidence is what the strategy routes this target on and how far it is believed (lifecycle.go).
	Evidence []Evidence `json:"evidence,omitempty"`
	// Adapters is what the engine reports of its LoRA adapters, for a provider a [routes.lora] route uses.
	Adapters *AdapterState `json:"adapters,omitempty"`
}

// State returns the view of the live snapshot. It is safe for concurrent use and never blocks requests.
func (g *Gateway) State() State {
	s := g.snap.Load()
	now := time.Now().UnixNano()
	st := State{Generation: s.gen}
	for _, r := range s.Routes {
		rs := RouteState{Model: r.Model, Strategy: r.StrategyName, Org: r.org, Decisions: r.m.Decisions()}
		tries := r.tries
		for i, t := range r.Targets {
			ts := targetState(s, t, now)
			if tries != nil {
				stats := tries[i].Stats()
				ts.TrieNodes, ts.TriePromptBytes = &stats.Nodes, &stats.EdgeBytes
			}
			ts.Evidence = evidenceOf(r, i)
			rs.Targets = append(rs.Targets, ts)
		}
		if pd := r.pd; pd != nil {
			rs.Disaggregation = disaggState(s, pd, now)
		}
		if r.lora != nil {
			rs.LoRA = loraState(r, now)
		}
		if ss := r.shadows; ss != nil {
			rs.ShadowDropped = ss.dropped.Get()
			for _, sh := range ss.shadows {
				rs.Shadows = append(rs.Shadows, ShadowState{Strategy: sh.name, Ranked: sh.m.ranked.Get(), Succeeded: sh.m.ended.Get(),
					Agreed: sh.m.agreed.Get(), LoadCoV: finite(sh.cov.value()),
					Reuse: Reuse{Scored: sh.m.scored.Get(), Held: sh.m.held.Get(), Captured: sh.m.captured.Get()}})
			}
		}
		st.Routes = append(st.Routes, rs)
	}
	return st
}

// targetState is what every target shows, in either pool of its route.
func targetState(s *Snapshot, t *Target, now int64) TargetState {
	p, m := t.Provider, t.m
	ts := TargetState{Provider: p.Name, Model: t.Model, Weight: t.Weight, Inflight: p.Inflight(), Requests: m.Requests()}
	ts.Eligible, ts.Why = p.health.status(now)
	if p.engineQueue != nil {
		if run, wait, ok := p.engineQueue(); ok {
			ts.EngineRunning, ts.EngineWaiting = &run, &wait
		}
	}
	ts.Measured, ts.Unmeasured = m.Measured.Get(), m.Unmeasured.Get()
	ts.PromptTokens, ts.CachedTokens = m.PromptTokens.Get(), m.CachedTokens.Get()
	ts.Reuse = Reuse{Scored: m.ReuseScored.Get(), Held: m.ReuseHeld.Get(), Captured: m.ReuseCaptured.Get()}
	ts.ReuseGap = finite(t.gap.value())
	if a := p.adapters; a != nil {
		ts.Adapters = a.state(now)
	}
	if src := s.kv[p.Name]; src != nil {
		kst := src.st.Stats()
		ts.KVBlocks, ts.KVTrusted, ts.KVReason = &kst.Blocks, &kst.Trusted, kst.Reason.String()
	}
	return ts
}

// disaggState is the state of a disaggregated route's decode pool and hops.
func disaggState(s *Snapshot, pd *pdRoute, now int64) *DisaggState {
	ds := &DisaggState{Protocol: config.ProtocolVLLM, PrefillThresholdTokens: pd.thresholdBytes / config.BytesPerToken,
		Decode: []TargetState{}, Reprefills: pd.m.Reprefills.Get(), KVParams: pd.m.ParamCounts(), Skipped: pd.m.SkipCounts(),
		Hops: DisaggHops{PrefillOK: pd.m.PrefillOK.Get(), PrefillFailed: pd.m.PrefillFailed.Get(),
			DecodeOK: pd.m.DecodeOK.Get(), DecodeFailed: pd.m.DecodeFailed.Get()}}
	if pd.sglang {
		port := int(pd.bootstrapPort)
		ds.Protocol, ds.BootstrapPort = config.ProtocolSGLang, &port
	}
	for _, t := range pd.decode {
		ds.Decode = append(ds.Decode, targetState(s, t, now))
	}
	return ds
}

// finite returns &v, or nil for NaN (not measured yet).
func finite(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}
