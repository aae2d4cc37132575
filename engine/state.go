package engine

import (
	"time"

	"github.com/rolter-ai/rolter/trie"
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
}

// State returns the view of the live snapshot. It is safe for concurrent use and never blocks requests.
func (g *Gateway) State() State {
	s := g.snap.Load()
	now := time.Now().UnixNano()
	st := State{Generation: s.gen}
	for _, r := range s.Routes {
		rs := RouteState{Model: r.Model, Strategy: r.StrategyName, Org: r.org, Decisions: r.m.Decisions()}
		var tries []*trie.Trie
		if h, ok := r.Strategy.(trieHolder); ok {
			tries = h.triesOf()
		}
		for i, t := range r.Targets {
			p := t.Provider
			ts := TargetState{Provider: p.Name, Model: t.Model, Weight: t.Weight, Inflight: p.Inflight(), Requests: t.m.Requests()}
			ts.Eligible, ts.Why = p.health.status(now)
			if p.engineQueue != nil {
				if run, wait, ok := p.engineQueue(); ok {
					ts.EngineRunning, ts.EngineWaiting = &run, &wait
				}
			}
			if tries != nil {
				stats := tries[i].Stats()
				ts.TrieNodes, ts.TriePromptBytes = &stats.Nodes, &stats.EdgeBytes
			}
			if src := s.kv[p.Name]; src != nil {
				kst := src.st.Stats()
				ts.KVBlocks, ts.KVTrusted, ts.KVReason = &kst.Blocks, &kst.Trusted, kst.Reason.String()
			}
			rs.Targets = append(rs.Targets, ts)
		}
		st.Routes = append(st.Routes, rs)
	}
	return st
}
