package engine

import (
	"sync/atomic"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/kvindex"
	"github.com/rolter-ai/rolter/telemetry"
	"github.com/rolter-ai/rolter/trie"
)

// Engine lifecycle (docs/architecture.md, "Engine lifecycle"): an engine whose prefix cache is known to be
// empty - it restarted (the scraper saw a new process_start_time_seconds) or came back from being marked
// unhealthy - must not keep receiving "its" prefixes on the strength of a trie that remembers what the old
// cache held. Each engine has a cache epoch; a trie carries the epoch its prompts were sent under
// (trie.Owner). A trie of another epoch scores nothing and is emptied the next time a request is sent to
// its target. And when a target's delivered reuse stays far below what its trie predicted (the routing
// evidence's gap), the trie is stale for another reason - an eviction storm, a template change - and is
// emptied too: a closed loop, with stale_gap and stale_window as route parameters.

// cacheEpoch numbers the contents of one engine's prefix cache. It is shared by the providers that name the
// same engine (name and api_base) across reloads, like the in-flight counter.
type cacheEpoch struct {
	n      atomic.Uint64
	reason atomic.Uint32 // resetReason of the last change
	resets [numResetReasons]atomic.Uint64
}

// cacheEpochs hands out epochs unique in the process, so a trie carried over to a provider for another
// engine (a changed api_base) never matches that engine's epoch by chance.
var cacheEpochs atomic.Uint64

func newCacheEpoch() *cacheEpoch {
	c := &cacheEpoch{}
	c.n.Store(cacheEpochs.Add(1))
	return c
}

// reset records that the engine's cache is empty.
func (c *cacheEpoch) reset(why resetReason) {
	c.resets[why].Add(1)
	c.reason.Store(uint32(why))
	c.n.Store(cacheEpochs.Add(1))
}

func (c *cacheEpoch) current() uint64 { return c.n.Load() }

// resetReason says why a trie was emptied: the label of rolter_trie_resets_total.
type resetReason uint8

const (
	resetEngineRestart resetReason = iota // a new process_start_time_seconds
	resetRecovered                        // back from unhealthy
	resetStale                            // delivered reuse far below the prediction
	numResetReasons
)

var _ = [1]int{}[len(telemetry.TrieResetReasons)-int(numResetReasons)] // the metric's labels follow resetReason

// matchFresh is t's match of key, or 0 when t holds prompts of an older cache epoch of its engine.
func matchFresh(t *trie.Trie, p *Provider, key []byte) int {
	if t.Owner() != p.cache.current() {
		return 0
	}
	return t.Match(key)
}

// insertFresh records key in the trie of target, first emptying it when it holds an older epoch.
func insertFresh(tr *trie.Trie, t *Target, key []byte) {
	if e := t.Provider.cache.current(); tr.Owner() != e {
		if tr.ResetOwner(e) && t.m != nil {
			t.m.TrieReset(int(t.Provider.cache.reason.Load()))
		}
	}
	tr.Insert(key)
}

// Defaults of the stale loop's route parameters.
const (
	defaultStaleGap    = config.DefaultStaleGap
	defaultStaleWindow = config.DefaultStaleWindow
)

// checkStale runs after a measured response of target t on route r: when the recent gap between what the
// trie predicted and what the engine delivered is above the route's stale_gap over at least stale_window
// measured responses, the target's trie is emptied (and the gap starts over).
func (r *Route) checkStale(t *Target) {
	if r.staleGap <= 0 || r.tries == nil {
		return
	}
	g := t.gap
	if g.samples.Load() < int64(r.staleWindow) || !(g.value() > r.staleGap) {
		return
	}
	tr := r.tries[t.Index]
	if !g.restart() {
		return // another request got there first
	}
	tr.Reset()
	t.m.TrieReset(int(resetStale))
}

// Evidence is one source of a target's routing evidence and how far it can be believed: source "trie"
// (the approximate prefix trie of cache_aware, pipeline and precise_cache_aware) or "kv_events" (the KV
// index of precise_cache_aware); trust "exact", "degraded" or "fallback", with a reason (kvindex.TrustReason
// names). A trie is exact while it belongs to its engine's current cache epoch, fallback with reason
// engine_restart when the engine's cache was emptied since (until the next request resets it).
type Evidence struct {
	Source string `json:"source"`
	Trust  string `json:"trust"`
	Reason string `json:"reason,omitempty"`
}

// evidenceOf lists target i's evidence on route r.
func evidenceOf(r *Route, i int) []Evidence {
	var ev []Evidence
	t := r.Targets[i]
	if r.tries != nil {
		state, why := trieTrust(r.tries[i], t.Provider)
		ev = append(ev, Evidence{Source: "trie", Trust: state.String(), Reason: why.String()})
	}
	if s, ok := r.Strategy.(*preciseCacheAware); ok {
		state, why := s.streams[i].Trust()
		ev = append(ev, Evidence{Source: "kv_events", Trust: state.String(), Reason: why.String()})
	}
	return ev
}

// trieTrust is a trie's trust: exact while it holds prompts of its engine's current cache epoch.
func trieTrust(tr *trie.Trie, p *Provider) (kvindex.TrustState, kvindex.TrustReason) {
	if tr.Owner() == p.cache.current() {
		return kvindex.TrustExact, kvindex.ReasonNone
	}
	return kvindex.TrustFallback, kvindex.ReasonEngineRestart
}

// registerEvidence exports rolter_evidence_trust{route,target,source} for r's targets (0 exact, 1 degraded,
// 2 fallback).
func registerEvidence(set *telemetry.Set, r *Route) {
	for i, t := range r.Targets {
		l := "route=" + telemetry.Label(r.Model) + ",target=" + telemetry.Label(t.Provider.Name)
		if r.tries != nil {
			tr, p := r.tries[i], t.Provider
			set.Gauge(telemetry.EvidenceTrust, l+`,source="trie"`, func() float64 {
				state, _ := trieTrust(tr, p)
				return float64(state)
			})
		}
		if s, ok := r.Strategy.(*preciseCacheAware); ok {
			st := s.streams[i]
			set.Gauge(telemetry.EvidenceTrust, l+`,source="kv_events"`, func() float64 {
				state, _ := st.Trust()
				return float64(state)
			})
		}
	}
}
