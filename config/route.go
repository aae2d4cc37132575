package config

// RouteConfig maps one public model name to targets and a strategy.
type RouteConfig struct {
	// Org owns a route made through the control plane ("" for the file's routes, which are public). A
	// request to an org's route needs one of the org's data-plane keys.
	Org      string         `toml:"-" json:"-"`
	Model    string         `toml:"model" json:"model"`
	Strategy string         `toml:"strategy" json:"strategy"`
	Targets  []TargetConfig `toml:"targets" json:"targets"`
	Params   RouteParams    `toml:"params" json:"params"`
	// Discovered names the sources whose endpoints are among Targets (set by the discovery Fleet, which
	// replaces each target naming a source by one per endpoint): such a route may have no targets yet, and
	// answers 503 until it has.
	Discovered []string `toml:"-" json:"-"`
	// Shadow ranks every request with other strategies too, without moving traffic ([routes.shadow];
	// engine/shadow.go).
	Shadow *ShadowConfig `toml:"shadow" json:"shadow,omitempty"`
	// Disaggregation makes Targets the prefill pool of a prefill/decode-disaggregated fleet and names its
	// decode pool ([routes.disaggregation]). The file's only: an org's route cannot be disaggregated.
	Disaggregation *DisaggregationConfig `toml:"disaggregation" json:"-"`
	// LoRA makes the route's engines serve LoRA adapters of its model, each routed within its home set
	// ([routes.lora]). The file's only.
	LoRA *LoRAConfig `toml:"lora" json:"-"`
	// LoRABase, on a route ServedRoutes made for an adapter, is the model of the route that names it.
	LoRABase string `toml:"-" json:"-"`
}

// ShadowConfig is [routes.shadow]: strategies that rank the route's requests beside the live one, each
// against its own counterfactual state, for comparison only.
type ShadowConfig struct {
	Strategies []string `toml:"strategies" json:"strategies"`
}

// needsKVEvents reports whether the route's strategy, or one of its shadows, routes on KV events.
func (rc *RouteConfig) NeedsKVEvents() bool {
	if Strategies[rc.Strategy].NeedsKVEvents {
		return true
	}
	if rc.Shadow != nil {
		for _, name := range rc.Shadow.Strategies {
			if Strategies[name].NeedsKVEvents {
				return true
			}
		}
	}
	return false
}

// MaxShadows bounds the shadow strategies of one route.
const MaxShadows = 4

// TargetConfig is one (provider, upstream model) pair of a route, or, with Source, one such pair for every
// endpoint a discovery source finds ([[sources]]).
type TargetConfig struct {
	Provider string   `toml:"provider,omitempty" json:"provider"`
	Source   string   `toml:"source,omitempty" json:"-"` // the file's only: an org's route cannot name a source
	Model    string   `toml:"model" json:"model"`
	Weight   *float64 `toml:"weight" json:"weight,omitempty"`
}

// RouteParams holds strategy parameters. A parameter that the route's strategy does not use is an error,
// so a typo or a misplaced parameter never goes unnoticed.
type RouteParams struct {
	Threshold      *float64 `toml:"threshold" json:"threshold,omitempty"`
	MaxTrieNodes   *int     `toml:"max_trie_nodes" json:"max_trie_nodes,omitempty"`
	MaxTrieBytes   *int     `toml:"max_trie_bytes" json:"max_trie_bytes,omitempty"`
	SessionTTLSecs *float64 `toml:"session_ttl_secs" json:"session_ttl_secs,omitempty"`
	MaxSessions    *int     `toml:"max_sessions" json:"max_sessions,omitempty"`
	Epsilon        *float64 `toml:"epsilon" json:"epsilon,omitempty"`
	VirtualNodes   *int     `toml:"virtual_nodes" json:"virtual_nodes,omitempty"`
	KeyBytes       *int     `toml:"key_bytes" json:"key_bytes,omitempty"`
	WeightFactor   *float64 `toml:"weight_factor" json:"weight_factor,omitempty"`
	LoadFactor     *float64 `toml:"load_factor" json:"load_factor,omitempty"`
	CacheFactor    *float64 `toml:"cache_factor" json:"cache_factor,omitempty"`
	// StaleGap and StaleWindow: a target's trie is emptied when its recent predicted reuse exceeds the
	// delivered by more than StaleGap over at least StaleWindow measured responses (0 turns it off).
	StaleGap    *float64 `toml:"stale_gap" json:"stale_gap,omitempty"`
	StaleWindow *int     `toml:"stale_window" json:"stale_window,omitempty"`
	// Home (cache_aware, precise_cache_aware): a request whose prefix no target holds goes to its conversation's rendezvous
	// home when that target is not overloaded (true), or to the least-loaded target (false).
	Home *bool `toml:"home" json:"home,omitempty"`
	// OverloadMargin and OverloadFactor (cache_aware): a target is overloaded when its load exceeds the
	// least-loaded eligible target's by more than the margin (2) and is more than factor (1.5) times it.
	OverloadMargin *float64 `toml:"overload_margin" json:"overload_margin,omitempty"`
	OverloadFactor *float64 `toml:"overload_factor" json:"overload_factor,omitempty"`
	// HotWindow (pipeline): how many recent requests the hot-prefix share is counted over; a prefix
	// matched by more than one engine's share of them has its cache term divided by the engines its
	// share fills. 0 turns it off.
	HotWindow *int `toml:"hot_window" json:"hot_window,omitempty"`
	// LoadBound (the cache strategies) is epsilon of the load bound every pick honours: a target takes a
	// request only while its in-flight per unit of weight stays within ceil((1 + epsilon) x the eligible
	// targets' average), the request counted; 0 turns it off (DefaultLoadBound).
	LoadBound *float64 `toml:"load_bound" json:"load_bound,omitempty"`
}
