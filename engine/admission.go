package engine

import (
	"sync/atomic"
	"time"

	"github.com/rolter-ai/rolter/config"
)

// admission caps the requests in flight to one provider ([queue] max_inflight_per_target) with a bounded
// wait queue (max_waiting_per_target, wait_timeout_secs). A full queue is answered at once with 429, never
// an unbounded pile-up (peer gateways grew memory to OOM under sustained load, e.g. BerriAI/litellm#12685;
// docs/architecture.md, "Peer gateways' failure reports we design against").
// The slot counter is the provider's in-flight counter itself, so the cap and the load strategies see the
// same number.
type admission struct {
	max     int64 // 0 = unlimited
	maxWait int64
	wait    time.Duration

	_       [64]byte
	waiting atomic.Int64
	_       [56]byte
	wake    chan struct{}
}

func newAdmission(q config.QueueConfig) *admission {
	a := &admission{max: int64(q.MaxInflightPerTarget), maxWait: int64(q.MaxWaitingPerTarget), wait: secs(q.WaitTimeoutSecs)}
	if a.max > 0 && a.maxWait > 0 {
		a.wake = make(chan struct{}, a.maxWait)
	}
	return a
}

// tryAcquire takes a slot without waiting.
func (a *admission) tryAcquire(inflight *atomic.Int64) bool {
	if a.max <= 0 {
		inflight.Add(1)
		return true
	}
	for {
		n := inflight.Load()
		if n >= a.max {
			return false
		}
		if inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// acquire takes a slot, waiting in the bounded queue when the provider is full. It returns false when the
// queue is full, the wait timed out, or cancel received (the client left: it must not be sent upstream).
func (a *admission) acquire(inflight *atomic.Int64, cancel <-chan struct{}) bool {
	if a.tryAcquire(inflight) {
		return true
	}
	if a.wake == nil || a.waiting.Add(1) > a.maxWait {
		if a.wake != nil {
			a.waiting.Add(-1)
		}
		return false
	}
	defer a.waiting.Add(-1)
	timer := time.NewTimer(a.wait)
	defer timer.Stop()
	for {
		if a.tryAcquire(inflight) {
			return true
		}
		select {
		case <-a.wake:
		case <-cancel:
			return false
		case <-timer.C:
			return a.tryAcquire(inflight)
		}
	}
}

// release frees a slot and wakes one waiter.
func (a *admission) release(inflight *atomic.Int64) {
	inflight.Add(-1)
	if a.wake != nil && a.waiting.Load() > 0 {
		select {
		case a.wake <- struct{}{}:
		default:
		}
	}
}
