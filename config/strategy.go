package config

import (
	"sort"
	"strings"

	"github.com/rolter-ai/rolter/trie"
)

// MaxTargets bounds the targets of one route, so the engine's per-request scratch is fixed-size and
// eligibility is a uint64 bitmask.
const MaxTargets = 64

// StrategySpec is what validation and printing know of a strategy: the parameters it takes and what it
// needs. The engine builds the strategy from its own table, by the same name.
type StrategySpec struct {
	Params        []string // the [routes.params] keys it accepts
	NeedsKVEvents bool     // routes on the providers' KV events ([providers.kv_events] on every target)
	UsesTries     bool     // keeps a prefix trie per target, sized by TrieShare
}

// Strategies are the routing strategies by name: a plain map, no registration from init functions, so
// every strategy is listed here. The engine's table of constructors names the same ones.
var Strategies = map[string]StrategySpec{
	"round_robin":  {},
	"random":       {},
	"weighted":     {},
	"least_load":   {},
	"power_of_two": {},
	"cache_aware": {
		Params: []string{"threshold", "max_trie_nodes", "max_trie_bytes", "stale_gap", "stale_window", "home",
			"overload_margin", "overload_factor", "load_bound"},
		UsesTries: true,
	},
	"pipeline": {
		Params: []string{"weight_factor", "load_factor", "cache_factor", "max_trie_nodes", "max_trie_bytes", "session_ttl_secs",
			"max_sessions", "stale_gap", "stale_window", "hot_window", "load_bound"},
		UsesTries: true,
	},
	"precise_cache_aware": {
		Params:        []string{"threshold", "max_trie_nodes", "max_trie_bytes", "stale_gap", "stale_window", "home", "load_bound"},
		NeedsKVEvents: true,
		UsesTries:     true,
	},
	"lmcache_aware": {Params: []string{"load_bound"}},
	"consistent_hash": {
		Params: []string{"epsilon", "virtual_nodes", "key_bytes"},
	},
}

// Defaults of the strategy parameters ([routes.params]) a route leaves out; the strategies explain their
// values (docs/architecture.md, "Routing rules").
const (
	DefaultThreshold    = 0.5
	DefaultMaxTrieNodes = trie.DefaultMaxNodes
	// DefaultOverloadMargin and DefaultOverloadFactor: a target is overloaded when its load is more than 2
	// requests beyond the least-loaded eligible target's and more than 1.5 times it.
	DefaultOverloadMargin = 2
	DefaultOverloadFactor = 1.5
	DefaultStaleGap       = 0.5
	DefaultStaleWindow    = 50
	DefaultSessionTTLSecs = 300.0
	DefaultMaxSessions    = 100_000
	DefaultVirtualNodes   = 160
	DefaultEpsilon        = 0.25
	DefaultKeyBytes       = 64 << 10
	DefaultWeightFactor   = 1.0
	DefaultLoadFactor     = 2.2
	DefaultCacheFactor    = 2.1
	DefaultHotWindow      = 128
)

// DefaultLoadBound returns the load bound's epsilon of a strategy whose route sets no "load_bound" (0: off),
// chosen with the KV-pressure report (docs/routing/load-bound.md): pipeline's load term balances (and
// precise_cache_aware's, the same term) and the bound is the backstop against a herd while other replicas
// idle (8: tighter ones cost hit rate on shared-prefix and the Mooncake trace). cache_aware keeps the seed
// page's overload rule alone; consistent_hash's bound is its "epsilon".
func DefaultLoadBound(strategy string) float64 {
	switch strategy {
	case "pipeline", "precise_cache_aware":
		return 8
	}
	return 0
}

func strategyNames() string {
	names := make([]string, 0, len(Strategies))
	for n := range Strategies {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}
