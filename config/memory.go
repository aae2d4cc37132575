package config

// TrieShare returns the default ceilings of one target's prefix trie: an equal share of what the explicit
// ceilings leave of [server] routing_memory_bytes (the validator keeps them within it) for every target of a
// route that keeps tries and does not set both ceilings itself, and every trie of a shadow strategy. A trie
// costs about 58 bytes per node plus 1.2 bytes per stored prompt byte (trie package benchmarks), so a share
// S allows 0.4 S stored bytes and 0.5 S / 64 nodes: at most about 0.95 S in all. With the 512 MiB default
// and 8 targets that is 26.8 MB of prompt text and 524,288 nodes per target. The node count never goes
// above the seed page's 1 million.
func (cfg *Config) TrieShare() (nodes, bytes int) {
	n := 0
	for _, rc := range cfg.Routes {
		if Strategies[rc.Strategy].UsesTries && (rc.Params.MaxTrieNodes == nil || rc.Params.MaxTrieBytes == nil) {
			n += len(rc.Targets)
		}
		if rc.Shadow != nil {
			for _, name := range rc.Shadow.Strategies {
				if Strategies[name].UsesTries {
					n += len(rc.Targets) // a shadow's tries take their share of the routing memory too
				}
			}
		}
	}
	share := max(cfg.Server.RoutingMemoryBytes-cfg.explicitTrieCost(), 0) / max(n, 1)
	nodes = min(max(share/2/64, 16), DefaultMaxTrieNodes)
	bytes = max(share*2/5, 1024)
	return nodes, bytes
}

// trieCost is the routing memory that one trie with the given explicit ceilings (nil: not set) may take:
// TrieShare's rule backwards (a share S allows S/128 nodes and 0.4 S stored bytes). The values are
// clamped first so that no ceiling overflows.
func trieCost(nodes, bytes *int) int {
	c := 0
	if nodes != nil {
		c = max(c, min(max(*nodes, 0), 1<<40)*128)
	}
	if bytes != nil {
		c = max(c, min(max(*bytes, 0), 1<<50)/2*5)
	}
	return c
}

// TrieCost is the routing memory the explicit trie ceilings of rc take, one trie per target; 0 for a
// route that sets none or keeps no tries.
func (rc *RouteConfig) TrieCost() int {
	if !Strategies[rc.Strategy].UsesTries {
		return 0
	}
	return trieCost(rc.Params.MaxTrieNodes, rc.Params.MaxTrieBytes) * len(rc.Targets)
}

// explicitTrieCost is the routing memory the explicit trie ceilings of every route of cfg take together.
func (cfg *Config) explicitTrieCost() int {
	n := 0
	for i := range cfg.Routes {
		n += cfg.Routes[i].TrieCost()
	}
	return n
}
