package loadtest

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// An explicit plan (Options.Plan) is a list of requests built elsewhere, such as a replayed
// trace (bench.Replay): it is sent as it is, in order, with each request's own max_tokens,
// x-session-id, dependency on its session's previous turn, and in a Timed plan its send time.

// maxPlanProblems bounds the problems checkExplicit lists.
const maxPlanProblems = 10

// checkExplicit reports the problems of an explicit plan (the first maxPlanProblems of them).
func (p *Plan) checkExplicit() error {
	var errs []error
	bad := func(format string, args ...any) bool {
		errs = append(errs, fmt.Errorf(format, args...))
		return len(errs) < maxPlanProblems
	}
	switch {
	case p.Conversations != nil:
		bad("an explicit plan holds requests, not conversations")
	case len(p.Requests) == 0:
		bad("the explicit plan has no request")
	case len(p.Requests) > maxPlanRequests:
		bad("the explicit plan has %d requests; at most %d", len(p.Requests), maxPlanRequests)
	}
	for i := range p.Requests {
		r := &p.Requests[i]
		ok := true
		switch {
		case len(r.Messages) == 0:
			ok = bad("request %d has no message", i)
		case r.MaxTokens < 0 || r.MaxTokens == 0 && p.Workload.OutputTokens <= 0:
			ok = bad("request %d: max tokens %d must be > 0 (or the workload's output tokens set)", i, r.MaxTokens)
		case r.After < 0 || r.After > i:
			ok = bad("request %d: after %d must name an earlier request (1 + its index)", i, r.After)
		case r.At < 0:
			ok = bad("request %d: send time %s must not be negative", i, r.At)
		case p.Timed && i > 0 && r.At < p.Requests[i-1].At:
			ok = bad("request %d: send time %s is before the previous request's %s", i, r.At, p.Requests[i-1].At)
		}
		if !ok {
			break
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cannot send the explicit plan: %w", err)
	}
	return nil
}

// schedulePacer sends hit i at at[i] from the start of the attack (a Timed plan) and stops after
// the last one.
type schedulePacer struct {
	at []time.Duration
}

func (p *schedulePacer) Pace(elapsed time.Duration, hits uint64) (time.Duration, bool) {
	if hits >= uint64(len(p.at)) {
		return 0, true
	}
	return p.at[hits] - elapsed, false
}

// Rate returns the mean rate of the schedule (vegeta only reports it).
func (p *schedulePacer) Rate(time.Duration) float64 {
	if len(p.at) < 2 || p.at[len(p.at)-1] <= 0 {
		return math.Inf(1)
	}
	return float64(len(p.at)) / p.at[len(p.at)-1].Seconds()
}

var _ vegeta.Pacer = (*schedulePacer)(nil)

// turns hands out the requests of an explicit plan in which some requests wait on an earlier one
// (Request.After). In a closed loop it hands out the first request in plan order whose
// predecessor has ended, so a session waiting for its previous turn does not hold a worker while
// other requests could go (as the live clients of other sessions would); in a Timed plan it
// hands them out strictly in order, each at its time, and the worker waits for the predecessor.
// It is safe for concurrent use.
type turns struct {
	reqs    []Request
	inOrder bool

	mu    sync.Mutex
	taken []bool
	ended []bool
	first int           // the first request not taken
	wake  chan struct{} // closed (and replaced) whenever a request ends
	abort chan struct{} // closed when the targeter failed: nothing more will end
	once  sync.Once     // closes abort
}

// newTurns returns the scheduler of the first limit requests of p, or nil when none waits on
// another.
func newTurns(p *Plan, limit int) *turns {
	need := false
	for i := range p.Requests[:limit] {
		if p.Requests[i].After > 0 {
			need = true
			break
		}
	}
	if !need {
		return nil
	}
	return &turns{reqs: p.Requests[:limit], inOrder: p.Timed, taken: make([]bool, limit), ended: make([]bool, limit),
		wake: make(chan struct{}), abort: make(chan struct{})}
}

var errStopped = errors.New("cannot send a later turn: the run stopped")

// take returns the index of the next request to send, vegeta.ErrNoTargets when every request
// was taken, or an error when done closes or the run stopped while it waited.
func (t *turns) take(done <-chan struct{}) (int, error) {
	for {
		t.mu.Lock()
		for t.first < len(t.taken) && t.taken[t.first] {
			t.first++
		}
		if t.first == len(t.taken) {
			t.mu.Unlock()
			return -1, vegeta.ErrNoTargets
		}
		pick, wait := -1, t.first
		for i := t.first; i < len(t.taken); i++ {
			if t.taken[i] {
				continue
			}
			if a := t.reqs[i].After; a == 0 || t.ended[a-1] || t.inOrder {
				pick, wait = i, t.reqs[i].After-1
				break
			}
		}
		if pick >= 0 {
			t.taken[pick] = true
		}
		ready := wait < 0 || t.ended[wait]
		wake := t.wake
		t.mu.Unlock()
		if pick >= 0 && ready {
			return pick, nil
		}
		select {
		case <-wake:
		case <-t.abort:
			if pick >= 0 {
				t.end(pick)
			}
			return -1, errStopped
		case <-done:
			if pick >= 0 {
				t.end(pick)
			}
			return -1, errStopped
		}
		if pick >= 0 { // in order: wait until its predecessor ended
			for {
				t.mu.Lock()
				ok, wake := t.ended[wait], t.wake
				t.mu.Unlock()
				if ok {
					return pick, nil
				}
				select {
				case <-wake:
				case <-t.abort:
					t.end(pick)
					return -1, errStopped
				case <-done:
					t.end(pick)
					return -1, errStopped
				}
			}
		}
	}
}

// end marks request i as ended (answered, failed, or given up). It is called once per request
// taken.
func (t *turns) end(i int) {
	if t == nil || i < 0 || i >= len(t.ended) {
		return
	}
	t.mu.Lock()
	t.ended[i] = true
	close(t.wake)
	t.wake = make(chan struct{})
	t.mu.Unlock()
}

// fail wakes every waiter: the targeter failed and the attack stops.
func (t *turns) fail() {
	if t == nil {
		return
	}
	t.once.Do(func() { close(t.abort) })
}
