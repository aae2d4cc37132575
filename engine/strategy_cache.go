package engine

import (
	"math/rand/v2"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/telemetry"
	"github.com/rolter-ai/rolter/trie"
)

// Defaults of the cache strategies (docs/architecture.md, "Routing rules").
const (
	defaultThreshold    = config.DefaultThreshold
	defaultMaxTrieNodes = config.DefaultMaxTrieNodes
	// defaultOverloadMargin and defaultOverloadFactor are the overload rule of docs/routing/cache-aware.md: more than 2
	// requests beyond the least-loaded eligible target and more than 1.5 times its load.
	defaultOverloadMargin = config.DefaultOverloadMargin
	defaultOverloadFactor = config.DefaultOverloadFactor
	// defaultMaxTrieBytes bounds each target's trie in stored prompt bytes as well as nodes, so memory has a
	// ceiling in bytes per target whatever the prompt sizes (docs/architecture.md, "Memory bounds").
	// A gateway's routes get smaller ceilings from trieShare; these apply where no config sized them.
	defaultMaxTrieBytes = 256 << 20
)

// newTries returns one trie per target of r with the route's ceilings. A target that was already a target
// of the route in the snapshot being replaced (same provider and upstream model) keeps its trie, with the
// new ceilings: a reload must not cold-start the routing memory.
func newTries(r *Route, p config.RouteParams, env *buildEnv) []*trie.Trie {
	maxNodes, maxBytes := defaultMaxTrieNodes, defaultMaxTrieBytes
	if p.MaxTrieNodes != nil {
		maxNodes = *p.MaxTrieNodes
	}
	if p.MaxTrieBytes != nil {
		maxBytes = *p.MaxTrieBytes
	}
	var prev []*trie.Trie
	if env != nil && env.prev != nil {
		if h, ok := env.prev.Strategy.(trieHolder); ok {
			prev = h.triesOf()
		}
	}
	tries := make([]*trie.Trie, len(r.Targets))
	for i, t := range r.Targets {
		if prev != nil {
			if j := env.prev.target(t.Provider.Name, t.Model); j >= 0 {
				tries[i] = prev[j]
				tries[i].SetLimits(maxNodes, maxBytes)
				continue
			}
		}
		tries[i] = trie.NewLimited(maxNodes, maxBytes)
		tries[i].SetOwner(t.Provider.cache.current())
	}
	return tries
}

// trieHolder is a strategy that keeps a trie per target.
type trieHolder interface {
	triesOf() []*trie.Trie
}

// cacheAware is the cache_aware strategy (docs/routing/cache-aware.md). Each target has a byte trie of the prompt keys it was
// sent; a request scores each eligible target by the fraction of its leading prompt-key bytes present there.
//
//   - best score >= threshold and the best target not overloaded: pin to it (prefix_hit);
//   - best target overloaded: the best-scoring target that still clears the threshold and is not overloaded,
//     if there is one (prefix_hit) - another replica holding the prefix beats a cold one;
//   - otherwise the least-loaded eligible target (no_match, or overloaded when every target clearing the
//     threshold was overloaded); when every eligible target has the same load, the least-warmed one, i.e. the
//     smallest trie (least_warmed);
//   - after forwarding, the prompt is recorded in the winner's trie.
//
// Overloaded(t) = load(t) > min_load + 2 AND load(t) > 1.5 x min_load, min over eligible targets: a short
// queue at the replica that holds the cache is worth waiting in, a long one is not, so a burst sharing one
// system prompt spreads over the fleet while each conversation's turns keep their replica. Ties (equal best
// scores, equal loads, equal trie sizes) are broken at random so bursts do not all land on the first target
// (sgl-project/sglang#6164). Only eligible targets are compared.
type cacheAware struct {
	threshold float64
	tries     []*trie.Trie // one per target, same index as Route.Targets
	// home sends a request nothing clears the threshold for to its conversation's rendezvous home (homeOf)
	// when that target is not overloaded, rather than to the least-loaded one; route parameter "home".
	home bool
	// margin and factor are the overload rule's; route parameters "overload_margin", "overload_factor".
	margin, factor float64
}

func newCacheAware(r *Route, p config.RouteParams, env *buildEnv) *cacheAware {
	s := &cacheAware{threshold: defaultThreshold, home: true, margin: defaultOverloadMargin, factor: defaultOverloadFactor}
	if p.Threshold != nil {
		s.threshold = *p.Threshold
	}
	if p.Home != nil {
		s.home = *p.Home
	}
	if p.OverloadMargin != nil {
		s.margin = *p.OverloadMargin
	}
	if p.OverloadFactor != nil {
		s.factor = *p.OverloadFactor
	}
	s.tries = newTries(r, p, env)
	return s
}

func (s *cacheAware) Rank(p *Pick, out []int) (int, Decision) {
	targets := p.Route.Targets
	n := len(p.Key)
	var mbuf [maxTargets]int
	var lbuf [maxTargets]int64
	bestLen := 0
	minLoad := int64(-1)
	if n > 0 {
		// The peers' evidence is a second score: what another replica sent to the target counts as held
		// there, as far as its checkpoints reach.
		p.matchEligible(s.tries, mbuf[:])
	}
	for k, i := range p.Eligible {
		lbuf[k] = targets[i].Load()
		bestLen = max(bestLen, mbuf[k])
		if minLoad < 0 || lbuf[k] < minLoad {
			minLoad = lbuf[k]
		}
	}
	score := 0.0
	if n > 0 {
		score = float64(bestLen) / float64(n)
		if p.Matches != nil {
			p.MatchOf = n
			for k, i := range p.Eligible {
				p.Matches[i] = int32(mbuf[k])
			}
		}
	}
	reason := ReasonNoMatch
	if bestLen > 0 && score >= s.threshold {
		// The longest match among the targets that clear the threshold and are not overloaded; equal
		// matches go to the less loaded, then by chance. When the best match is not overloaded this is the
		// seed rule's pin; when it is, a second replica that already holds the prefix takes the request
		// before a cold one (affinity-preserving rebalancing, asked for in sgl-project/sglang#32195), so a
		// hot group does not scatter over the fleet.
		best, bestM, bestLoad, ties := -1, 0, int64(0), uint64(0)
		for k, i := range p.Eligible {
			m, l := mbuf[k], lbuf[k]
			if m == 0 || float64(m)/float64(n) < s.threshold || s.overloaded(l, minLoad) {
				continue
			}
			switch {
			case best < 0 || m > bestM || (m == bestM && l < bestLoad):
				best, bestM, bestLoad, ties = i, m, l, 1
			case m == bestM && l == bestLoad:
				ties++
				if rand.Uint64N(ties) == 0 {
					best = i
				}
			}
		}
		if best >= 0 {
			out[0] = best
			return 1, Decision{Reason: ReasonPrefixHit, Score: float64(bestM) / float64(n)}
		}
		reason = ReasonOverloaded
	} else if s.home {
		// Nothing holds the prefix: the conversation's home, which every replica computes alike, so
		// replicas that never talk still place a new conversation on one engine. The overload rule holds.
		if k, ok := homeOf(p); ok && !s.overloaded(lbuf[k], minLoad) {
			out[0] = p.Eligible[k]
			return 1, Decision{Reason: ReasonHome, Score: score}
		}
	}
	out[0], reason = s.leastLoaded(p, mbuf[:len(p.Eligible)], lbuf[:len(p.Eligible)], minLoad, reason)
	return 1, Decision{Reason: reason, Score: score}
}

// overloaded is the documented rule: more than 2 requests beyond the least-loaded eligible target and more
// than 1.5 times its load.
func overloaded(load, minLoad int64) bool {
	return load > minLoad+defaultOverloadMargin && float64(load) > defaultOverloadFactor*float64(minLoad)
}

// overloaded is the overload rule with the route's margin and factor.
func (s *cacheAware) overloaded(load, minLoad int64) bool {
	return float64(load) > float64(minLoad)+s.margin && float64(load) > s.factor*float64(minLoad)
}

// leastLoaded returns the eligible target with the smallest load - among several, the one with the longest
// match, so a rebalanced request still lands where some of its prefix is - or, when all loads are equal (no
// load is known), the least-warmed one; remaining ties at random. matches and loads are per p.Eligible.
func (s *cacheAware) leastLoaded(p *Pick, matches []int, loads []int64, minLoad int64, reason Reason) (int, Reason) {
	allEqual := true
	for _, l := range loads {
		if l != minLoad {
			allEqual = false
			break
		}
	}
	if !allEqual {
		best, bestM, ties := -1, 0, uint64(0)
		for k, i := range p.Eligible {
			if loads[k] != minLoad {
				continue
			}
			switch m := matches[k]; {
			case best < 0 || m > bestM:
				best, bestM, ties = i, m, 1
			case m == bestM:
				ties++
				if rand.Uint64N(ties) == 0 {
					best = i
				}
			}
		}
		return best, reason
	}
	best, bestNodes, ties := -1, 0, uint64(0)
	for _, i := range p.Eligible {
		n := s.tries[i].Nodes()
		switch {
		case best < 0 || n < bestNodes:
			best, bestNodes, ties = i, n, 1
		case n == bestNodes:
			ties++
			if rand.Uint64N(ties) == 0 {
				best = i
			}
		}
	}
	if reason == ReasonNoMatch {
		reason = ReasonLeastWarmed
	}
	return best, reason
}

// Routed records the prompt in the winner's trie.
func (s *cacheAware) Routed(p *Pick, target int) {
	insertFresh(s.tries[target], p.Route.Targets[target], p.Key)
}

func (s *cacheAware) triesOf() []*trie.Trie { return s.tries }

// registerTrieMetrics exports the tries' sizes for /metrics.
func registerTrieMetrics(set *telemetry.Set, r *Route, tries []*trie.Trie) {
	for i, t := range r.Targets {
		tr := tries[i]
		l := "route=" + telemetry.Label(r.Model) + ",target=" + telemetry.Label(t.Provider.Name)
		set.Gauge(telemetry.TrieNodes, l, func() float64 { return float64(tr.Nodes()) })
		set.Gauge(telemetry.TrieEdgeBytes, l, func() float64 { return float64(tr.Stats().EdgeBytes) })
		set.Gauge(telemetry.TrieArenaBytes, l, func() float64 { return float64(tr.Stats().ArenaBytes) })
		set.Gauge(telemetry.TriePrompts, l, func() float64 { return float64(tr.Stats().Prompts) })
		set.CounterFunc(telemetry.TrieEvictions, l, func() uint64 { return tr.Stats().Evictions })
	}
}

var (
	_ Strategy = (*cacheAware)(nil)
	_ Recorder = (*cacheAware)(nil)
)
