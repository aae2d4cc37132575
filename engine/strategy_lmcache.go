package engine

import (
	"math/rand/v2"
)

// lmcacheAware prefers eligible targets whose LMCache reports cache_available, the lowest occupancy first
// (ties by load), unless that target is overloaded (cache_aware's rule). Targets without a source, or with a
// failed or stale one, are neutral: they neither win nor lose on cache. With no available target it is least
// load over the targets not known to be unavailable (docs/architecture.md, "Routing rules").
type lmcacheAware struct{}

func (lmcacheAware) Rank(p *Pick, out []int) (int, Decision) {
	targets := p.Route.Targets
	best, bestOcc := -1, 0.0
	var bestLoad, minLoad int64 = 0, -1
	var unavailable uint64
	ties := uint64(0)
	for _, i := range p.Eligible {
		l := targets[i].Load()
		if minLoad < 0 || l < minLoad {
			minLoad = l
		}
		occ, avail, ok := targets[i].Provider.lmcache.get(p.Now)
		if !ok {
			continue
		}
		if !avail {
			unavailable |= 1 << i
			continue
		}
		switch {
		case best < 0 || occ < bestOcc || (occ == bestOcc && l < bestLoad):
			best, bestOcc, bestLoad, ties = i, occ, l, 1
		case occ == bestOcc && l == bestLoad:
			ties++
			if rand.Uint64N(ties) == 0 {
				best = i
			}
		}
	}
	if best >= 0 && !overloaded(bestLoad, minLoad) {
		out[0] = best
		return 1, Decision{Reason: ReasonCacheAvail, Score: 1 - bestOcc}
	}
	// Least load, avoiding targets known to be unavailable when others remain.
	if unavailable != 0 && unavailable != p.EligibleMask {
		saved, savedMask := p.Eligible, p.EligibleMask
		kept := p.tmp[:0]
		for _, i := range saved {
			if unavailable&(1<<i) == 0 {
				kept = append(kept, i)
			}
		}
		p.Eligible, p.EligibleMask = kept, savedMask&^unavailable
		out[0], _ = leastLoaded(p)
		p.Eligible, p.EligibleMask = saved, savedMask
	} else {
		out[0], _ = leastLoaded(p)
	}
	return 1, decide(ReasonLeastLoad)
}

var _ Strategy = lmcacheAware{}
