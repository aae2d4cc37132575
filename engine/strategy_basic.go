package engine

import (
	"math"
	"math/rand/v2"
	"sync/atomic"
)

// roundRobin cycles through the eligible targets.
type roundRobin struct {
	_    [64]byte // keep the hot counter off the cache line of neighbouring allocations
	next atomic.Uint64
	_    [56]byte
}

func (s *roundRobin) Rank(p *Pick, out []int) (int, Decision) {
	n := len(p.Eligible)
	start := int(s.next.Add(1)-1) % n
	for i := 0; i < n; i++ {
		out[i] = p.Eligible[(start+i)%n]
	}
	return n, decide(ReasonRoundRobin)
}

// randomPick chooses uniformly among the eligible targets.
type randomPick struct{}

func (randomPick) Rank(p *Pick, out []int) (int, Decision) {
	out[0] = p.Eligible[rand.IntN(len(p.Eligible))]
	return 1, decide(ReasonRandom)
}

// leastLoad chooses the eligible target with the fewest requests in flight (plus its scraped queue).
type leastLoad struct{}

func (leastLoad) Rank(p *Pick, out []int) (int, Decision) {
	out[0], _ = leastLoaded(p)
	return 1, decide(ReasonLeastLoad)
}

// powerOfTwo samples two distinct eligible targets and keeps the less loaded one
// ("the power of two random choices", Mitzenmacher 2001).
type powerOfTwo struct{}

func (powerOfTwo) Rank(p *Pick, out []int) (int, Decision) {
	n := len(p.Eligible)
	if n == 1 {
		out[0] = p.Eligible[0]
		return 1, decide(ReasonPowerOfTwo)
	}
	i := rand.IntN(n)
	j := rand.IntN(n - 1)
	if j >= i {
		j++
	}
	a, b := p.Eligible[i], p.Eligible[j]
	la, lb := p.Route.Targets[a].Load(), p.Route.Targets[b].Load()
	if lb < la || (lb == la && rand.IntN(2) == 0) {
		a, b = b, a
	}
	out[0], out[1] = a, b
	return 2, decide(ReasonPowerOfTwo)
}

// weighted is smooth weighted round robin (nginx's algorithm): for weights 5,1,1 it yields a,a,b,a,c,a,a
// rather than a,a,a,a,a,b,c. The sequence is computed once at build time and walked with one atomic
// counter, so picking is lock-free; ineligible targets are skipped in sequence order, which keeps the
// remaining targets' ratios.
type weighted struct {
	seq  []uint8
	_    [64]byte
	next atomic.Uint64
	_    [56]byte
}

// weightResolution is what the largest weight becomes when weights are scaled to integers for the sequence.
const weightResolution = 1000

func newWeighted(r *Route) *weighted {
	maxW := 0.0
	for _, t := range r.Targets {
		maxW = math.Max(maxW, t.Weight)
	}
	ints := make([]int, len(r.Targets))
	g := 0
	for i, t := range r.Targets {
		ints[i] = max(1, int(math.Round(t.Weight/maxW*weightResolution)))
		g = gcd(g, ints[i])
	}
	total := 0
	for i := range ints {
		ints[i] /= g
		total += ints[i]
	}
	seq := make([]uint8, 0, total)
	cur := make([]int, len(ints))
	for range total {
		best := 0
		for i, w := range ints {
			cur[i] += w
			if cur[i] > cur[best] {
				best = i
			}
		}
		cur[best] -= total
		seq = append(seq, uint8(best))
	}
	return &weighted{seq: seq}
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func (s *weighted) Rank(p *Pick, out []int) (int, Decision) {
	n := uint64(len(s.seq))
	start := s.next.Add(1) - 1
	for k := uint64(0); k < n; k++ {
		t := int(s.seq[(start+k)%n])
		if p.EligibleMask&(1<<t) != 0 {
			out[0] = t
			return 1, decide(ReasonWeighted)
		}
	}
	out[0] = p.Eligible[0] // unreachable: every target appears in seq
	return 1, decide(ReasonWeighted)
}

var (
	_ Strategy = (*roundRobin)(nil)
	_ Strategy = randomPick{}
	_ Strategy = leastLoad{}
	_ Strategy = powerOfTwo{}
	_ Strategy = (*weighted)(nil)
)
