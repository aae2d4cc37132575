package limits

import "sync/atomic"

// Gauge bounds requests in flight: Acquire takes a place when fewer than its limit are taken, Release
// gives it back. Lock-free: a compare-and-swap loop on one counter.
//
// Like a Bucket, a gauge may hold a share of its limit: ceil(limit / N) of N gateways' places.
type Gauge struct {
	n     atomic.Int64
	limit int64
	eff   atomic.Int64
}

// NewGauge returns a gauge of limit places (limit > 0).
func NewGauge(limit int64) *Gauge {
	g := &Gauge{limit: limit}
	g.eff.Store(limit)
	return g
}

// Limit is the gauge's places; InFlight how many are taken.
func (g *Gauge) Limit() int64    { return g.limit }
func (g *Gauge) InFlight() int64 { return g.n.Load() }

// SetShare makes the gauge hold ceil(limit / of) places (of >= 1).
func (g *Gauge) SetShare(of int64) { g.eff.Store((g.limit + max(of, 1) - 1) / max(of, 1)) }

// Acquire takes a place if one is free.
func (g *Gauge) Acquire() bool {
	for {
		n := g.n.Load()
		if n >= g.eff.Load() {
			return false
		}
		if g.n.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Release gives back a place Acquire took.
func (g *Gauge) Release() { g.n.Add(-1) }
