package engine

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/kvindex"
	"github.com/rolter-ai/rolter/trie"
)

// preciseCacheAware scores each eligible target by the fraction of the request's full token blocks resident
// on its GPU, from vLLM's KV events (x-rolter-vllm-token-ids carries the ids). When the best fraction clears
// the threshold, the targets are weighed as pipeline weighs them - weight, load relative to the least loaded,
// and the share of the prompt resident beyond what every target holds, divided for a hot prefix as pipeline
// divides it - so a prefix resident on several engines goes to the least loaded of them, and a holder keeps a
// prompt while its saving outweighs its queue.
// A block an engine evicted stops counting with its BlockRemoved event. cache_aware's overload rule is not
// used for holders: under KV pressure its spills to cold targets cost a fifth of the hits on the Mooncake
// trace; the route's load bound (bound.go, "load_bound", default 8) is the hard ceiling.
// Where that exact evidence is missing - the target's event stream is not trusted
// (gap, restart, malformed, stale, no events yet), or the request carries no or malformed ids - the target
// is scored by its approximate prefix trie, as cache_aware would (the two indexes back each other up), so a
// fleet whose streams are still warming up routes by prefix, not by load alone. With no evidence at all it
// is least load, and x-rolter-decision says why (docs/architecture.md, "Routing rules"). Nothing resident
// clears the threshold: the conversation's home unless it is overloaded (cache_aware's rule), else least load.
type preciseCacheAware struct {
	threshold float64
	ix        *kvindex.Index
	ids       []int             // route target -> kv id
	streams   []*kvindex.Stream // route target -> its stream
	tries     []*trie.Trie      // route target -> its approximate index
	home      bool              // route parameter "home", as cache_aware's
	// hot counts the recent requests' best-held prefixes, as pipeline's hot_window does with its default
	// window: a prefix more than one engine's share of them holds has its cache term divided by the engines
	// its share fills, so its holders do not outbid an idle engine.
	hot *hotPrefixes
}

func newPrecise(r *Route, p config.RouteParams, env *buildEnv) (*preciseCacheAware, error) {
	if env.kv == nil {
		return nil, fmt.Errorf("BUG: no KV event state for route %q", r.Model)
	}
	s := &preciseCacheAware{threshold: defaultThreshold, ix: env.kv.ix, home: true, hot: newHotPrefixes(defaultHotWindow)}
	if p.Threshold != nil {
		s.threshold = *p.Threshold
	}
	if p.Home != nil {
		s.home = *p.Home
	}
	for _, t := range r.Targets {
		src := env.kvSources[t.Provider.Name]
		if src == nil {
			return nil, fmt.Errorf("BUG: no KV event source for provider %q", t.Provider.Name)
		}
		s.ids = append(s.ids, src.id)
		s.streams = append(s.streams, src.st)
	}
	s.tries = newTries(r, p, env)
	return s, nil
}

func (s *preciseCacheAware) triesOf() []*trie.Trie { return s.tries }

func (s *preciseCacheAware) Rank(p *Pick, out []int) (int, Decision) {
	targets := p.Route.Targets
	haveIDs := p.TokenIDsState == tokenIDsOK
	var resident []int
	if haveIDs {
		resident = p.kvOut[:s.ix.MaxTargets()]
		s.ix.Match(p.TokenIDs, p.kvScratch, resident)
	}
	n := len(p.Key)
	unit := n // the predicted reuse's unit: tokens with ids, key bytes without
	if haveIDs {
		unit = len(p.TokenIDs)
	}
	var sbuf [maxTargets]float64
	var lbuf [maxTargets]int64
	exact, evidence := false, false
	for k, i := range p.Eligible {
		lbuf[k] = targets[i].Load()
		score := 0.0
		if haveIDs && s.streams[i].Trusted() {
			exact, evidence = true, true
			id := s.ids[i]
			if full := len(p.TokenIDs) / s.ix.BlockSize(id); full > 0 {
				score = float64(resident[id]) / float64(full)
			}
		} else if n > 0 {
			if m := matchFresh(s.tries[i], targets[i].Provider, p.Key); m > 0 {
				score, evidence = float64(m)/float64(n), true
			}
		}
		sbuf[k] = score
		if p.Matches != nil && unit > 0 {
			p.Matches[i], p.MatchOf = int32(math.Round(score*float64(unit))), unit
		}
	}
	if evidence {
		bestScore := 0.0
		for k := range p.Eligible {
			bestScore = max(bestScore, sbuf[k])
		}
		if bestScore > 0 && bestScore >= s.threshold {
			cacheF := defaultCacheFactor
			if n > 0 {
				// The prefix is named by the key bytes its best resident share covers, at the peers'
				// checkpoint resolution, as pipeline names its matches.
				m := peerFloor(min(n, int(bestScore*float64(n))))
				if r := s.hot.record(p.prefixName(m)) * float64(len(p.Eligible)); r > 1 {
					cacheF /= r
				}
			}
			k := s.score(p, sbuf[:len(p.Eligible)], lbuf[:len(p.Eligible)], cacheF)
			out[0] = p.Eligible[k]
			return 1, Decision{Reason: ReasonPrefixHit, Score: sbuf[k]}
		}
		if exact && s.home {
			// Nothing resident clears the threshold: the conversation's home, as cache_aware sends it, so
			// replicas that share every engine's events also agree on where a new conversation starts.
			if k, ok := homeOf(p); ok && !overloaded(lbuf[k], minLoadOf(lbuf[:len(p.Eligible)])) {
				out[0] = p.Eligible[k]
				return 1, Decision{Reason: ReasonHome, Score: bestScore}
			}
		}
		if exact {
			out[0], _ = leastLoaded(p)
			return 1, Decision{Reason: ReasonNoMatch, Score: bestScore}
		}
	}
	out[0], _ = leastLoaded(p)
	switch {
	case p.TokenIDsState == tokenIDsAbsent:
		return 1, decide(ReasonNoTokenIDs)
	case p.TokenIDsState == tokenIDsMalformed:
		return 1, decide(ReasonBadTokenIDs)
	case !exact:
		return 1, decide(ReasonUntrusted)
	}
	return 1, decide(ReasonNoMatch)
}

// score returns the position in p.Eligible of the target with the best pipeline score over the resident
// fractions: weight, load relative to the least loaded (per unit of weight) and the share of the prompt
// resident beyond what every target holds, with pipeline's default factors (cacheF for the last); ties at
// random. scores and loads
// are per p.Eligible.
func (s *preciseCacheAware) score(p *Pick, scores []float64, loads []int64, cacheF float64) int {
	targets := p.Route.Targets
	maxW, minS := 0.0, 1.0
	for k, i := range p.Eligible {
		maxW = max(maxW, targets[i].Weight)
		minS = min(minS, scores[k])
	}
	var effBuf [maxTargets]float64
	minEff := -1.0
	for k, i := range p.Eligible {
		effBuf[k] = float64(loads[k]) * maxW / targets[i].Weight
		if minEff < 0 || effBuf[k] < minEff {
			minEff = effBuf[k]
		}
	}
	best, bestScore, ties := -1, 0.0, uint64(0)
	for k, i := range p.Eligible {
		saved := 0.0
		if minS < 1 {
			saved = (scores[k] - minS) / (1 - minS)
		}
		sc := pipelineScore(defaultWeightFactor, defaultLoadFactor, cacheF, targets[i].Weight/maxW, (minEff+1)/(effBuf[k]+1), saved)
		switch {
		case best < 0 || sc > bestScore:
			best, bestScore, ties = k, sc, 1
		case sc == bestScore:
			ties++
			if rand.Uint64N(ties) == 0 {
				best = k
			}
		}
	}
	return best
}

// minLoadOf returns the smallest of loads.
func minLoadOf(loads []int64) int64 {
	m := loads[0]
	for _, l := range loads[1:] {
		m = min(m, l)
	}
	return m
}

// Routed records the prompt in the target's approximate trie.
func (s *preciseCacheAware) Routed(p *Pick, target int) {
	insertFresh(s.tries[target], p.Route.Targets[target], p.Key)
}

// parseTokenIDs parses x-rolter-vllm-token-ids strictly: decimal ids separated by single commas, each at
// most 2^32-1. Anything else (spaces, signs, empty items, overflow) is malformed and the header is ignored.
func parseTokenIDs(dst []uint32, h []byte) ([]uint32, bool) {
	var v uint64
	digits := 0
	for _, c := range h {
		switch {
		case c >= '0' && c <= '9':
			v = v*10 + uint64(c-'0')
			digits++
			if v > 1<<32-1 {
				return dst, false
			}
		case c == ',':
			if digits == 0 {
				return dst, false
			}
			dst = append(dst, uint32(v))
			v, digits = 0, 0
		default:
			return dst, false
		}
	}
	if digits == 0 {
		return dst, false
	}
	return append(dst, uint32(v)), true
}

var (
	_ Strategy = (*preciseCacheAware)(nil)
	_ Recorder = (*preciseCacheAware)(nil)
)
