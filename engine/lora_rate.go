package engine

import (
	"math"
	"sync/atomic"
)

// rateCount is an adapter's request rate at this gateway: its requests, each weighing exp(-age/tau) - an
// exponentially decayed count, which the placement compares between adapters (lora.go). Requests add to a
// plain counter; the decayed score folds them in at most once per tau/rateSteps, by the one request that
// wins the fold, so the count costs one atomic add per request and stays lock-free. A reader between the
// fold's stores sees the rate blurred by one step's requests for a moment.
type rateCount struct {
	n      atomic.Int64  // requests ever counted
	at     atomic.Int64  // unix nanoseconds of the last fold
	folded atomic.Int64  // n at the last fold
	score  atomic.Uint64 // float64 bits: the decayed count at the last fold
}

// rateSteps is how many folds a time constant holds: the pending requests are counted undecayed, at most
// 1/rateSteps of a time constant old.
const rateSteps = 16

// add counts a request at now with time constant tau (nanoseconds, > 0).
func (r *rateCount) add(now, tau int64) {
	r.n.Add(1)
	at := r.at.Load()
	if now-at < tau/rateSteps || !r.at.CompareAndSwap(at, now) {
		return
	}
	n := r.n.Load()
	s := math.Float64frombits(r.score.Load())*decay(now-at, tau) + float64(n-r.folded.Load())
	r.score.Store(math.Float64bits(s))
	r.folded.Store(n)
}

// rate returns the decayed count at now.
func (r *rateCount) rate(now, tau int64) float64 {
	pending := float64(r.n.Load() - r.folded.Load())
	return math.Float64frombits(r.score.Load())*decay(now-r.at.Load(), tau) + pending
}

// decay is exp(-dt/tau), 1 for a dt not positive (clocks read on different cores).
func decay(dt, tau int64) float64 {
	if dt <= 0 {
		return 1
	}
	return math.Exp(-float64(dt) / float64(tau))
}
