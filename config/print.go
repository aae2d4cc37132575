package config

import (
	"fmt"
	"io"

	"github.com/BurntSushi/toml"
)

// Effective returns a copy of cfg (a validated config) with every default written out, the strategy
// parameters included: what the gateway actually runs with. The section and per-element defaults are in cfg
// already (Default, SetDefaults); the strategy parameters are not, because an unset max_trie_nodes or
// max_trie_bytes is a share of server.routing_memory_bytes that changes with the routes, so they are
// written out here. cfg is not changed.
func (cfg *Config) Effective() *Config {
	e := *cfg
	e.Providers = append([]ProviderConfig(nil), cfg.Providers...)
	e.Routes = make([]RouteConfig, len(cfg.Routes))
	nodes, bytes := cfg.TrieShare()
	for i, rc := range cfg.Routes {
		p := rc.Params
		for _, name := range Strategies[rc.Strategy].Params {
			switch name {
			case "threshold":
				p.Threshold = orDefault(p.Threshold, DefaultThreshold)
			case "max_trie_nodes":
				p.MaxTrieNodes = orDefault(p.MaxTrieNodes, nodes)
			case "max_trie_bytes":
				p.MaxTrieBytes = orDefault(p.MaxTrieBytes, bytes)
			case "session_ttl_secs":
				p.SessionTTLSecs = orDefault(p.SessionTTLSecs, DefaultSessionTTLSecs)
			case "max_sessions":
				p.MaxSessions = orDefault(p.MaxSessions, DefaultMaxSessions)
			case "epsilon":
				p.Epsilon = orDefault(p.Epsilon, DefaultEpsilon)
			case "virtual_nodes":
				p.VirtualNodes = orDefault(p.VirtualNodes, DefaultVirtualNodes)
			case "key_bytes":
				p.KeyBytes = orDefault(p.KeyBytes, DefaultKeyBytes)
			case "weight_factor":
				p.WeightFactor = orDefault(p.WeightFactor, DefaultWeightFactor)
			case "load_factor":
				p.LoadFactor = orDefault(p.LoadFactor, DefaultLoadFactor)
			case "cache_factor":
				p.CacheFactor = orDefault(p.CacheFactor, DefaultCacheFactor)
			case "stale_gap":
				p.StaleGap = orDefault(p.StaleGap, DefaultStaleGap)
			case "stale_window":
				p.StaleWindow = orDefault(p.StaleWindow, DefaultStaleWindow)
			case "home":
				p.Home = orDefault(p.Home, true)
			case "overload_margin":
				p.OverloadMargin = orDefault(p.OverloadMargin, float64(DefaultOverloadMargin))
			case "hot_window":
				p.HotWindow = orDefault(p.HotWindow, DefaultHotWindow)
			case "overload_factor":
				p.OverloadFactor = orDefault(p.OverloadFactor, DefaultOverloadFactor)
			case "load_bound":
				p.LoadBound = orDefault(p.LoadBound, DefaultLoadBound(rc.Strategy))
			default:
				panic(fmt.Sprintf("BUG: no default for parameter %q", name))
			}
		}
		rc.Params = p
		e.Routes[i] = rc
	}
	return &e
}

func orDefault[T any](v *T, def T) *T {
	if v != nil {
		return v
	}
	return &def
}

// WriteTOML writes cfg as rolter.toml text (`rolter check -print`); it loads back as the same config.
func (cfg *Config) WriteTOML(w io.Writer) error {
	enc := toml.NewEncoder(w)
	enc.Indent = ""
	if err := enc.Encode(cfg); err != nil {
		return fmt.Errorf("cannot write the config: %w", err)
	}
	return nil
}
