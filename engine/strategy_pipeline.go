package engine

import (
	"log/slog"
	"math/rand/v2"
	"sync/atomic"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/trie"
)

// Default pipeline factors, chosen with the routing benchmark (docs/benchmarks/routing-quality.md, pipeline sweep) and
// the KV-pressure report (bench/results/pressure.md): load_factor must exceed cache_factor, or a
// replica holding a hot prefix can never lose it to an idle one and the rest of the fleet sits idle
// (hot-prefix, multi-turn). At 2.5 : 2 a holder lost a prefix as soon as its load passed ~4.6x the idlest
// target's, and under KV pressure every such spill left a second copy that evicted others (shared-prefix at
// 50%: 0.89 of the placement reference, groups on 1.5 engines); 2.2 : 2 holds the prefix to ~9x (0.97,
// 1.1 engines; multi-turn 0.94 -> 0.96), and hot_window spreads the one prefix that really needs more
// than one engine (hot-prefix burst: busiest/idlest 4.1 without it, 1.1 with it). Once the cache term
// counted only what not every target holds, 2.2 : 2 measured 0.954-0.960 of the placement reference on
// shared-prefix at 50% over three runs and 2.2 : 2.1 0.996-0.997 over two, multi-turn 0.99 both, burst
// busiest/idlest 1.1: a whole-prompt holder now keeps it to ~21x the idlest target's load, a partial one
// less (the load term still wins in the end: load_factor > cache_factor).
const (
	defaultWeightFactor = config.DefaultWeightFactor
	defaultLoadFactor   = config.DefaultLoadFactor
	defaultCacheFactor  = config.DefaultCacheFactor
	defaultHotWindow    = config.DefaultHotWindow
)

// hotPrefixes is a ring of the last requests' matched prefixes, each named by the hash of the request's
// longest match rounded down to the peers' checkpoint resolution (peerFloor), so every request of a shared
// system prompt names it alike while each conversation's history names only its own. Safe for concurrent
// use; lock-free and allocation-free. Concurrent writers may overwrite each other's slot: the share is an
// estimate.
type hotPrefixes struct {
	slots []atomic.Uint64
	// next is written by every pick: on a cache line of its own, apart from the slots' header every pick
	// reads.
	_    [64]byte
	next atomic.Uint64
	_    [56]byte
}

func newHotPrefixes(window int) *hotPrefixes {
	return &hotPrefixes{slots: make([]atomic.Uint64, window)}
}

// record adds h to the ring and returns the share of the window's slots that held h before.
func (r *hotPrefixes) record(h uint64) float64 {
	n := 0
	for i := range r.slots {
		if r.slots[i].Load() == h {
			n++
		}
	}
	r.slots[(r.next.Add(1)-1)%uint64(len(r.slots))].Store(h)
	return float64(n) / float64(len(r.slots))
}

// pipeline is the three-stage strategy of docs/routing/pipeline.md: filter (only eligible targets reach Rank) -> score ->
// argmax with a random tie-break. score(t) = weight_factor x weight(t)/max weight
//
//   - load_factor x (min load + 1)/(load(t) + 1)
//   - cache_factor x (match(t) - min match)/(prompt - min match)
//
// Every term is in 0..1. The load term is relative - twice the load of the least-loaded target scores about
// half - so it means the same at 2 and at 200 requests in flight; load includes the engine's scraped queue
// when [metrics_scrape] is on. The cache term is cache_aware's match fraction (the trie's, and the peers'
// evidence with [cluster]) taken over the part of the prompt that not every eligible target holds: the share
// of the prefill t saves over the coldest target. A prefix every engine holds (a system prompt all
// conversations share) is no reason to prefer one engine; counted in the fraction, it let a small load
// imbalance move a conversation off the engine holding its history (the KV-pressure report, multi-turn-short at 50%: 143
// of 2628 turns moved, 2.3 of the 3 points pipeline was below the placement reference). A hot prefix -
// matched by a share h of the last hot_window requests with h x eligible targets = r > 1 - has its
// cache_factor divided by r, the engines its traffic fills.
//
// A request with x-session-id goes to the target its session was last bound to while that binding is
// younger than session_ttl_secs (idle time) and the target is eligible; otherwise it is scored and re-bound.
type pipeline struct {
	weightF, loadF, cacheF float64
	// hot counts the recent requests' matched prefixes (route parameter "hot_window"; nil: off).
	hot      *hotPrefixes
	weights  []float64 // weight(t)
	tries    []*trie.Trie
	sessions *sessions
	log      *slog.Logger
}

func newPipeline(r *Route, p config.RouteParams, env *buildEnv) *pipeline {
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
	hotWindow := defaultHotWindow
	if p.HotWindow != nil {
		hotWindow = *p.HotWindow
	}
	if hotWindow > 0 {
		s.hot = newHotPrefixes(hotWindow)
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
	var mbuf [maxTargets]int
	// minM is the prefix every eligible target holds (0 without a cache term): the cache term counts only
	// what a target holds beyond it (see the score below).
	bestM, minM := 0, n
	if s.cacheF == 0 {
		minM = 0
	}
	if n > 0 && s.cacheF != 0 {
		p.matchEligible(s.tries, mbuf[:])
		for k, i := range p.Eligible {
			bestM, minM = max(bestM, mbuf[k]), min(minM, mbuf[k])
			if p.Matches != nil {
				p.Matches[i], p.MatchOf = int32(mbuf[k]), n
			}
		}
	}
	// A hot prefix - one that more than one engine's share of the recent requests matched - is worth less
	// per holder: its cache term is divided by the engines its traffic fills, so load spreads it over that
	// many engines instead of queueing on the first holder (the KV-pressure report, hot-prefix burst).
	cacheF := s.cacheF
	if s.hot != nil && bestM > 0 {
		if r := s.hot.record(p.prefixName(peerFloor(bestM))) * float64(len(p.Eligible)); r > 1 {
			cacheF /= r
		}
	}
	best, bestScore, bestMatch := -1, 0.0, 0.0
	ties := uint64(0)
	for k, i := range p.Eligible {
		match, saved := 0.0, 0.0
		if n > 0 {
			match = float64(mbuf[k]) / float64(n)
		}
		if minM < n {
			saved = float64(mbuf[k]-minM) / float64(n-minM)
		}
		score := pipelineScore(s.weightF, s.loadF, cacheF, s.weights[i]/maxW, (minEff+1)/(effBuf[k]+1), saved)
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

// pipelineScore is the score of docs/routing/pipeline.md with factors weightF, loadF and cacheF, for a target of
// relative weight w (weight / max weight), relative load l ((min eff + 1) / (eff + 1)) and saved share c.
func pipelineScore(weightF, loadF, cacheF, w, l, c float64) float64 {
	return weightF*w + loadF*l + cacheF*c
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
