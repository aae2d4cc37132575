package engine

import (
	"math/rand/v2"

	"github.com/rolter-ai/rolter/config"
)

// loadBound is a route's bound on any one target's load (docs/routing/load-bound.md): target t may take a
// request only while
//
//	load(t) + 1 <= (1 + epsilon) x weight(t) x others(t) + boundSlack
//
// others(t) being the load per unit of weight of the other eligible targets (Σ load / Σ weight over them):
// consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018), per unit of weight, against
// the others' average rather than one that includes t: with two targets of weights 2 : 1, (1 + epsilon) x
// the heavier one's share of an average over both is above the whole load for any epsilon >= 0.5, so it
// would never bind. The least loaded target per weight is at
// or below the others' average, so it always has room and the bound always holds. A strategy's first
// choice without room gives way to its next candidate with room, else to the eligible target with room that
// holds the longest match (the strategy's Matches), the least loaded per weight among equals. Load counts
// the requests picked and not yet admitted (Provider.picked), so a burst cannot herd onto one target before
// its in-flight count moves.
type loadBound struct {
	epsilon float64
	weights []float64 // weight(t), by route target
}

// boundSlack is the bound's constant: the requests a target may hold beyond its weighted share of the
// others' load, so that at low load a holder keeps its next requests - two, as the overload rule's margin.
const boundSlack = 2

// rank ranks the eligible targets for p: the strategy's ranking, then the route's load bound.
func (r *Route) rank(p *Pick, out []int) (int, Decision) {
	n, d := r.Strategy.Rank(p, out)
	if r.bound != nil {
		var moved bool
		if n, moved = r.bound.apply(p, out, n); moved {
			d = Decision{Reason: ReasonBounded, Score: p.matchFraction(out[0])}
		}
	}
	return n, d
}

// routeLoadBound is the epsilon of a route's load bound: consistent_hash's "epsilon", the cache strategies'
// "load_bound", or their default.
func routeLoadBound(strategy string, p config.RouteParams) float64 {
	switch {
	case strategy == "consistent_hash":
		if p.Epsilon != nil {
			return *p.Epsilon
		}
		return defaultEpsilon
	case p.LoadBound != nil:
		return *p.LoadBound
	}
	return config.DefaultLoadBound(strategy)
}

func newLoadBound(r *Route, epsilon float64) *loadBound {
	if !(epsilon > 0) {
		return nil
	}
	b := &loadBound{epsilon: epsilon, weights: make([]float64, len(r.Targets))}
	for i, t := range r.Targets {
		b.weights[i] = t.Weight
		if !(b.weights[i] > 0) {
			b.weights[i] = 1
		}
	}
	return b
}

// apply moves a candidate with room to the front of out[:n] when the first has none, and returns the new
// length and whether it moved one. len(out) >= len(p.Eligible).
func (b *loadBound) apply(p *Pick, out []int, n int) (int, bool) {
	targets := p.Route.Targets
	var lbuf [maxTargets]int64
	total, weight := int64(0), 0.0
	for _, i := range p.Eligible {
		lbuf[i] = targets[i].Load()
		total += lbuf[i]
		weight += b.weights[i]
	}
	room := func(i int) bool {
		w := weight - b.weights[i]
		if w <= 0 {
			return true // the only eligible target
		}
		others := float64(total-lbuf[i]) / w
		return float64(lbuf[i]+1) <= (1+b.epsilon)*b.weights[i]*others+boundSlack
	}
	if n == 0 || room(out[0]) {
		return n, false
	}
	for j := 1; j < n; j++ {
		if t := out[j]; room(t) {
			copy(out[1:j+1], out[:j])
			out[0] = t
			return n, true
		}
	}
	best, bestM, bestL, ties := -1, int32(0), 0.0, uint64(0)
	for _, i := range p.Eligible {
		if !room(i) {
			continue
		}
		m := int32(0)
		if p.MatchOf > 0 {
			m = p.Matches[i]
		}
		l := float64(lbuf[i]+1) / b.weights[i]
		switch {
		case best < 0 || m > bestM || (m == bestM && l < bestL):
			best, bestM, bestL, ties = i, m, l, 1
		case m == bestM && l == bestL:
			ties++
			if rand.Uint64N(ties) == 0 {
				best = i
			}
		}
	}
	if best < 0 {
		return n, false
	}
	if n >= len(out) {
		n = len(out) - 1
	}
	copy(out[1:n+1], out[:n])
	out[0] = best
	return n + 1, true
}
