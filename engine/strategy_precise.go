package engine

import (
	"fmt"
	"math/rand/v2"

	"github.com/rolter-ai/rolter/kvindex"
)

// preciseCacheAware scores each eligible target by the fraction of the request's full token blocks resident
// on its GPU, from vLLM's KV events (x-rolter-vllm-token-ids carries the ids). Same threshold and overload
// rule as cache_aware. A target whose event stream is not trusted (gap, restart, malformed, stale) scores
// as unknown and cannot win on cache; with no trusted target, no ids or malformed ids it is least load, and
// x-rolter-decision says which (docs/architecture.md, "Routing rules").
type preciseCacheAware struct {
	threshold float64
	ix        *kvindex.Index
	ids       []int             // route target -> kv id
	streams   []*kvindex.Stream // route target -> its stream
}

func newPrecise(r *Route, p RouteParams, env *buildEnv) (*preciseCacheAware, error) {
	if env.kv == nil {
		return nil, fmt.Errorf("BUG: no KV event state for route %q", r.Model)
	}
	s := &preciseCacheAware{threshold: defaultThreshold, ix: env.kv.ix}
	if p.Threshold != nil {
		s.threshold = *p.Threshold
	}
	for _, t := range r.Targets {
		src := env.kvSources[t.Provider.Name]
		if src == nil {
			return nil, fmt.Errorf("BUG: no KV event source for provider %q", t.Provider.Name)
		}
		s.ids = append(s.ids, src.id)
		s.streams = append(s.streams, src.st)
	}
	return s, nil
}

func (s *preciseCacheAware) Rank(p *Pick, out []int) (int, Decision) {
	switch p.TokenIDsState {
	case tokenIDsAbsent:
		out[0], _ = leastLoaded(p)
		return 1, decide(ReasonNoTokenIDs)
	case tokenIDsMalformed:
		out[0], _ = leastLoaded(p)
		return 1, decide(ReasonBadTokenIDs)
	}
	resident := p.kvOut[:s.ix.MaxTargets()]
	s.ix.Match(p.TokenIDs, p.kvScratch, resident)
	targets := p.Route.Targets
	best, bestScore, ties, trusted := -1, -1.0, uint64(0), false
	var bestLoad int64
	minLoad := int64(-1)
	for _, i := range p.Eligible {
		l := targets[i].Load()
		if minLoad < 0 || l < minLoad {
			minLoad = l
		}
		id := s.ids[i]
		if !s.streams[i].Trusted() {
			continue
		}
		trusted = true
		score := 0.0
		if full := len(p.TokenIDs) / s.ix.BlockSize(id); full > 0 {
			score = float64(resident[id]) / float64(full)
		}
		if p.Matches != nil {
			p.Matches[i], p.MatchOf = int32(resident[id]*s.ix.BlockSize(id)), len(p.TokenIDs)
		}
		// Targets holding the same number of blocks are ties: the less loaded wins, then chance.
		switch {
		case score > bestScore || (score == bestScore && l < bestLoad):
			best, bestScore, bestLoad, ties = i, score, l, 1
		case score == bestScore && l == bestLoad:
			ties++
			if rand.Uint64N(ties) == 0 {
				best = i
			}
		}
	}
	if !trusted {
		out[0], _ = leastLoaded(p)
		return 1, decide(ReasonUntrusted)
	}
	reason := ReasonNoMatch
	if bestScore > 0 && bestScore >= s.threshold {
		if !overloaded(bestLoad, minLoad) {
			out[0] = best
			return 1, Decision{Reason: ReasonPrefixHit, Score: bestScore}
		}
		reason = ReasonOverloaded
	}
	out[0], _ = leastLoaded(p)
	return 1, Decision{Reason: reason, Score: bestScore}
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

var _ Strategy = (*preciseCacheAware)(nil)
