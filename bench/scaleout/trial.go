package scaleout

import (
	"math"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/loadtest"
)

// Trial is one cell of the matrix: a (scenario, strategy, gateway count) in one repeat.
type Trial struct {
	Scenario string `json:"scenario"`
	Strategy string `json:"strategy"`
	Gateways int    `json:"gateways"`
	Repeat   int    `json:"repeat"`
	Seed     uint64 `json:"seed"`
	// Unavailable is set ("not available in this build: ...") when the strategy could not run.
	Unavailable string `json:"unavailable,omitempty"`
	// Error is set when the cell failed for another reason.
	Error  string           `json:"error,omitempty"`
	Result *loadtest.Result `json:"result,omitempty"`
	// EngineRequests are the completion requests each engine received (its own counter), and
	// EngineCoV their coefficient of variation (population stddev / mean): the load spread.
	EngineRequests []int   `json:"engine_requests"`
	EngineCoV      float64 `json:"engine_cov"`
	// Inflight is each engine's mean running + waiting requests (sampled every 20 ms, middle 80% of
	// the run), and InflightCoV the CoV of those means.
	Inflight    fleet.InflightSummary `json:"inflight"`
	InflightCoV float64               `json:"inflight_cov"`
	// Per gateway, in HAProxy server order: what each one's /metrics counted over the run, and the TCP
	// connections HAProxy gave it (its stats socket, `stot`, minus the readiness probe's).
	GatewayRequests    []int     `json:"gateway_requests"`
	GatewayConnections []int     `json:"gateway_connections"`
	GatewayHitRate     []float64 `json:"gateway_hit_rate"`
	// GatewayKVEvents are the KV events each gateway's subscribers received (precise_cache_aware: every
	// gateway subscribes to every engine).
	GatewayKVEvents []int `json:"gateway_kv_events"`
	// GatewayKVTargets is, per gateway, the number of engines it received KV events from.
	GatewayKVTargets []int   `json:"gateway_kv_targets"`
	GroupsSplit      int     `json:"groups_split"`      // groups (users) served by more than one engine
	EnginesPerGroup  float64 `json:"engines_per_group"` // mean distinct engines per group (user)
	Seconds          float64 `json:"seconds"`           // the whole cell, processes included

	// pids of the processes the cell started (gateways, HAProxy), for the tests' cleanup check.
	pids []int
}

// Available reports whether the cell measured something.
func (r *Trial) Available() bool {
	return r.Unavailable == "" && r.Error == "" && r.Result != nil
}

// cov returns the coefficient of variation of vs (population stddev / mean), 0 for an empty or
// all-zero set.
func cov(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	mean := 0.0
	for _, v := range vs {
		mean += v
	}
	mean /= float64(len(vs))
	if mean == 0 {
		return 0
	}
	ss := 0.0
	for _, v := range vs {
		ss += (v - mean) * (v - mean)
	}
	return math.Sqrt(ss/float64(len(vs))) / mean
}
