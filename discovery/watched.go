package discovery

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/rolter-ai/rolter/config"
)

// watched is one running source: its watcher's goroutine and what the watcher last reported. It is the
// watcher's Sink.
type watched struct {
	cfg    config.SourceConfig
	kick   func() // tells the fleet something changed
	cancel func() // stops the watcher
	done   chan struct{}
	synced chan struct{} // closed at the first report, Set or Fail
	once   sync.Once

	mu         sync.Mutex
	eps        []Endpoint        // the last set, sorted by key, one per key
	readySince map[Key]time.Time // when each ready endpoint of eps was first seen ready, in a row
	settled    bool              // a Set came: later endpoints settle before they take traffic
	counters   sourceCounters

	// made are the providers made of the endpoints so far, by key, so an expansion makes only the new
	// ones. Used by expand only, under the fleet's applyMu.
	made map[Key]madeProvider
}

// madeProvider is the provider made of one endpoint, and the overrides it was made with.
type madeProvider struct {
	kvEvents, lmcache string
	p                 config.ProviderConfig
}

// provider returns the provider of endpoint e, made once per endpoint (and again if its overrides
// change); next collects the ones in use, which replace made after the expansion.
func (w *watched) provider(e *Endpoint, next map[Key]madeProvider) config.ProviderConfig {
	k := e.Key()
	m, ok := w.made[k]
	if !ok || m.kvEvents != e.KVEvents || m.lmcache != e.LMCache {
		m = madeProvider{kvEvents: e.KVEvents, lmcache: e.LMCache,
			p: w.cfg.ProviderFor(config.EndpointName(w.cfg.Name, e.Addr, e.UID), e.Addr, e.KVEvents, e.LMCache)}
	}
	next[k] = m
	return m.p
}

// sourceCounters are what a source's status counts.
type sourceCounters struct {
	syncs, errors uint64
	lastSync      time.Time
	lastError     string
	lastErrorAt   time.Time
	failing       bool // the last report was Fail
}

func newWatched(sc *config.SourceConfig, kick func()) *watched {
	return &watched{cfg: *sc, kick: kick, done: make(chan struct{}), synced: make(chan struct{}), readySince: map[Key]time.Time{}}
}

// Set records the source's whole set. An endpoint first seen ready starts its settle time now, but on
// the first Set, whose ready endpoints take traffic at once (the fleet as it is when the gateway starts
// or the source is added).
func (w *watched) Set(eps []Endpoint) {
	now := time.Now()
	eps = canonical(eps)
	w.mu.Lock()
	since := now
	if !w.settled {
		since = now.Add(-w.settle())
		w.settled = true
	}
	next := make(map[Key]time.Time, len(eps))
	for _, e := range eps {
		if !e.Ready {
			continue
		}
		if t, ok := w.readySince[e.Key()]; ok {
			next[e.Key()] = t
		} else {
			next[e.Key()] = since
		}
	}
	w.eps, w.readySince = eps, next
	w.counters.syncs++
	w.counters.lastSync, w.counters.failing = now, false
	w.mu.Unlock()
	w.once.Do(func() { close(w.synced) })
	w.kick()
}

// Fail records that the source cannot see its set now; the last set stands.
func (w *watched) Fail(err error) {
	w.mu.Lock()
	w.counters.errors++
	w.counters.lastError, w.counters.lastErrorAt, w.counters.failing = err.Error(), time.Now(), true
	w.mu.Unlock()
	w.once.Do(func() { close(w.synced) })
	w.kick()
}

func (w *watched) settle() time.Duration {
	return time.Duration(w.cfg.SettleSecs * float64(time.Second))
}

// canonical sorts eps by key and keeps one endpoint per key: the ready one, when an address is in two
// EndpointSlices while one of them catches up.
func canonical(eps []Endpoint) []Endpoint {
	slices.SortStableFunc(eps, func(a, b Endpoint) int { return compareKeys(a.Key(), b.Key()) })
	out := eps[:0]
	for _, e := range eps {
		if n := len(out); n > 0 && out[n-1].Key() == e.Key() {
			if e.Ready && !out[n-1].Ready {
				out[n-1] = e
			}
			continue
		}
		out = append(out, e)
	}
	return out
}

func compareKeys(a, b Key) int {
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	return cmp.Compare(a.UID, b.UID)
}

// view is a source's set as of now: every endpoint with its state, and when the next settling one
// becomes live (zero if none is settling).
func (w *watched) view(now time.Time) (eps []Endpoint, states []string, next time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	settle := w.settle()
	states = make([]string, len(w.eps))
	for i, e := range w.eps {
		switch since, ready := w.readySince[e.Key()]; {
		case e.Terminating:
			states[i] = StateTerminating
		case !ready:
			states[i] = StateNotReady
		case settle > 0 && now.Sub(since) < settle:
			states[i] = StateSettling
			if at := since.Add(settle); next.IsZero() || at.Before(next) {
				next = at
			}
		default:
			states[i] = StateLive
		}
	}
	return w.eps, states, next
}

// carry takes over old's set, so the source it replaces keeps its endpoints until the new watcher
// reports; the new watcher's endpoints settle like any change.
func (w *watched) carry(old *watched) {
	old.mu.Lock()
	defer old.mu.Unlock()
	w.eps = old.eps
	for k, t := range old.readySince {
		w.readySince[k] = t
	}
	w.settled = old.settled
	w.counters = old.counters
}
