package engine

import (
	"log/slog"
	"math/rand/v2"

	"github.com/rolter-ai/rolter/trie"
)

// Default pipeline factors, chosen with the routing benchmark (README "Routing quality", pipeline sweep):
// load_factor must exceed cache_factor, or a replica holding a hot prefix can never lose it to an idle one
// and the rest of the fleet sits idle (hot-prefix, multi-turn); 2.5 : 2 kept every engine busy (max/min share
// <= 1.17 on all three workloads) at 0.96 of the oracle hit rate on shared-prefix.
const (
	defaultWeightFactor = 1.0
	defaultLoadFactor   = 2.5
	defaultCacheFactor  = 2.0
)

// pipeline is the seed page's three-stage strategy: filter (only eligible targets reach Rank) -> score ->
// argmax with a random tie-break. score(t) = weight_factor x weight(t)/max weight
//
//   - load_factor x (min load + 1)/(load(t) + 1)
//   - cache_factor x prefix-match fraction(t)
//
// Every term is in 0..1. The load term is relative - twice the load of the least-loaded target scores about
// half - so it means the same at 2 and at 200 requests in flight; load includes the engine's scraped queue
// when [metrics_scrape] is on. The cache term is cache_aware's match fraction (the trie's, and the peers'
// evidence with [cluster]).
//
// A request with x-session-id goes to the target its session was last bound to while that binding is
// younger than session_ttl_secs (idle time) and the target is eligible; otherwise it is scored and re-bound.
type pipeline struct {
	weightF, loadF, cacheF float64
	weights                []float64 // weight(t)
	tries                  []*trie.Trie
	sessions               *sessions
	log                    *slog.Logger
}

func newPipeline(r *Route, p RouteParams, env *buildEnv) *pipeline {
	s := &pipeline{weightF: defaultWeightFactor, loadF: defaultLoadFactor, cacheF: defaultCacheFactor, sessions: newSessions(p), log: slog.Default()}
	if env != nil && env.log != nil {
		s.log = env.log.With("route", r.Model)
	}
	if p.WeightFactor != nil {
		s.weightF = *p.WeightFactor
	}
	if p.LoadFactor != nil {
		s.loadF = *p.LoadFactor
	}
	if p.CacheFactor != nil {
		s.cacheF = *p.CacheFactor
	}
	for _, t := range r.Targets {
		s.weights = append(s.weights, t.Weight)
	}
	s.tries = newTries(r, p, env)
	if env != nil && env.prev != nil {
		if old, ok := env.prev.Strategy.(*pipeline); ok {
			// Session bindings survive a reload, pointed at the same targets' new indexes.
			s.sessions.takeOver(old.sessions, func(i int) int {
				t := env.prev.Targets[i]
				return r.target(t.Provider.Name, t.Model)
			})
		}
	}
	return s
}

func (s *pipeline) triesOf() []*trie.Trie { return s.tries }

func (s *pipeline) Rank(p *Pick, out []int) (int, Decision) {
	if len(p.SessionID) > 0 {
		if t, ok := s.sessions.lookup(p.SessionID, p.Now); ok && p.EligibleMask&(1<<t) != 0 {
			out[0] = t
			return 1, decide(ReasonSession)
		}
	}
	targets := p.Route.Targets
	maxW := 0.0
	for _, i := range p.Eligible {
		maxW = max(maxW, s.weights[i])
	}
	// Load relative to capacity: a target of twice the weight carries twice the requests for the same score.
	var effBuf [maxTargets]float64
	minEff := -1.0
	for k, i := range p.Eligible {
		e := float64(targets[i].Load()) * maxW / s.weights[i]
		effBuf[k] = e
		if minEff < 0 || e < minEff {
			minEff = e
		}
	}
	n := len(p.Key)
	best, bestScore, bestMatch := -1, 0.0, 0.0
	ties := uint64(0)
	for k, i := range p.Eligible {
		match := 0.0
		if n > 0 && s.cacheF != 0 {
			m := p.match(s.tries[i], targets[i])
			match = float64(m) / float64(n)
			if p.Matches != nil {
				p.Matches[i], p.MatchOf = int32(m), n
			}
		}
		score := s.weightF*s.weights[i]/maxW +
			s.loadF*(minEff+1)/(effBuf[k]+1) +
			s.cacheF*match
		switch {
		case best < 0 || score > bestScore:
			best, bestScore, bestMatch, ties = i, score, match, 1
		case score == bestScore:
			ties++
			if rand.Uint64N(ties) == 0 {
				best, bestMatch = i, match
			}
		}
	}
	out[0] = best
	return 1, Decision{Reason: ReasonScore, Score: bestMatch}
}

// Routed records the prompt in the winner's trie and (re)binds the session.
func (s *pipeline) Routed(p *Pick, target int) {
	if s.cacheF != 0 {
		insertFresh(s.tries[target], p.Route.Targets[target], p.Key)
	}
	if len(p.SessionID) > 0 {
		s.sessions.bind(p.SessionID, target, p.Now)
	}
}

func (s *pipeline) Start() { s.sessions.start(s.log.Error) }

func (s *pipeline) Stop() { s.sessions.stop() }

var (
	_ Strategy  = (*pipeline)(nil)
	_ Recorder  = (*pipeline)(nil)
	_ lifecycle = (*pipeline)(nil)
)
