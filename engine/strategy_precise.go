package engine

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"

	"github.com/rolter-ai/rolter/kvindex"
	"github.com/rolter-ai/rolter/telemetry"
)

// kvState is the exact residency index of a snapshot: one kvindex.Index shared by every provider with
// [providers.kv_events] that a precise_cache_aware route uses, fed by one subscriber goroutine per provider.
type kvState struct {
	ix      *kvindex.Index
	sub     *kvindex.Subscriber
	streams []*kvindex.Stream // by kv id
	ids     map[string]int    // provider name -> kv id
	cancel  context.CancelFunc
}

func newKVState(s *Snapshot, log *slog.Logger) (*kvState, error) {
	kv := &kvState{ids: map[string]int{}}
	for _, r := range s.cfg.Routes {
		if !strategies[r.Strategy].needsKVEvents {
			continue
		}
		for _, t := range r.Targets {
			if _, ok := kv.ids[t.Provider]; !ok {
				kv.ids[t.Provider] = len(kv.ids)
			}
		}
	}
	if len(kv.ids) == 0 {
		return nil, nil
	}
	if len(kv.ids) > kvindex.MaxTargets {
		return nil, fmt.Errorf("at most %d providers can feed precise_cache_aware, got %d", kvindex.MaxTargets, len(kv.ids))
	}
	kv.ix = kvindex.NewIndex(len(kv.ids))
	sub, err := kvindex.NewSubscriber(kv.ix, log.With("component", "kv_events"))
	if err != nil {
		return nil, err
	}
	kv.sub = sub
	kv.streams = make([]*kvindex.Stream, len(kv.ids))
	for _, p := range s.Providers {
		id, ok := kv.ids[p.Name]
		if !ok {
			continue
		}
		c := p.cfg.KVEvents
		st, err := sub.Add(id, kvindex.SubscriberConfig{
			Endpoint:       c.Endpoint,
			Topic:          c.Topic,
			ReplayEndpoint: c.ReplayEndpoint,
			Mode:           c.Mode,
			StaleAfter:     secs(c.StaleSecs),
			MaxBlocks:      c.MaxBlocks,
		})
		if err != nil {
			sub.Stop()
			return nil, fmt.Errorf("cannot subscribe to the KV events of provider %q: %w", p.Name, err)
		}
		kv.streams[id] = st
		registerKVMetrics(s.set, p.Name, st)
	}
	return kv, nil
}

func (kv *kvState) start() {
	ctx, cancel := context.WithCancel(context.Background())
	kv.cancel = cancel
	kv.sub.Start(ctx)
}

func (kv *kvState) stop() {
	if kv.cancel != nil {
		kv.cancel()
	}
	kv.sub.Stop()
}

func registerKVMetrics(set *telemetry.Set, target string, st *kvindex.Stream) {
	l := "target=" + telemetry.Label(target)
	stat := func(f func(s *kvindex.StreamStats) float64) func() float64 {
		return func() float64 { s := st.Stats(); return f(&s) }
	}
	set.Gauge(telemetry.KVBlocks, l, stat(func(s *kvindex.StreamStats) float64 { return float64(s.Blocks) }))
	set.Gauge(telemetry.KVTrusted, l, func() float64 {
		if st.Trusted() {
			return 1
		}
		return 0
	})
	set.Gauge(telemetry.KVLastSeq, l, stat(func(s *kvindex.StreamStats) float64 { return float64(s.LastSeq) }))
	for _, e := range []struct {
		kind string
		f    func(s *kvindex.StreamStats) uint64
	}{
		{"stored", func(s *kvindex.StreamStats) uint64 { return s.StoredEvents }},
		{"removed", func(s *kvindex.StreamStats) uint64 { return s.RemovedEvents }},
		{"cleared", func(s *kvindex.StreamStats) uint64 { return s.ClearedEvents }},
		{"unknown_type", func(s *kvindex.StreamStats) uint64 { return s.SkippedEvents }},
	} {
		f := e.f
		set.CounterFunc(telemetry.KVEvents, l+",kind="+telemetry.Label(e.kind), func() uint64 { s := st.Stats(); return f(&s) })
	}
	for _, e := range []struct {
		event string
		f     func(s *kvindex.StreamStats) uint64
	}{
		{"batches", func(s *kvindex.StreamStats) uint64 { return s.Batches }},
		{"gaps", func(s *kvindex.StreamStats) uint64 { return s.Gaps }},
		{"lost_batches", func(s *kvindex.StreamStats) uint64 { return s.LostBatches }},
		{"restarts", func(s *kvindex.StreamStats) uint64 { return s.Restarts }},
		{"replays_ok", func(s *kvindex.StreamStats) uint64 { return s.ReplaysOK }},
		{"replays_failed", func(s *kvindex.StreamStats) uint64 { return s.ReplaysFailed }},
		{"decode_errors", func(s *kvindex.StreamStats) uint64 { return s.DecodeErrors }},
		{"garbage_frames", func(s *kvindex.StreamStats) uint64 { return s.GarbageFrames }},
		{"stale", func(s *kvindex.StreamStats) uint64 { return s.StaleTransitions }},
		{"missed_events", func(s *kvindex.StreamStats) uint64 { return s.MissedEvents }},
		{"unknown_parents", func(s *kvindex.StreamStats) uint64 { return s.UnknownParents }},
		{"evictions", func(s *kvindex.StreamStats) uint64 { return s.Evictions }},
		{"implausible_jumps", func(s *kvindex.StreamStats) uint64 { return s.ImplausibleJumps }},
		{"queue_drops", func(s *kvindex.StreamStats) uint64 { return s.QueueDrops }},
		{"disconnects", func(s *kvindex.StreamStats) uint64 { return s.Disconnects }},
	} {
		f := e.f
		set.CounterFunc(telemetry.KVStream, l+",event="+telemetry.Label(e.event), func() uint64 { s := st.Stats(); return f(&s) })
	}
}

// preciseCacheAware scores each eligible target by the fraction of the request's full token blocks resident
// on its GPU, from vLLM's KV events (x-rolter-vllm-token-ids carries the ids). Same threshold and overload
// rule as cache_aware. A target whose event stream is not trusted (gap, restart, malformed, stale) scores
// as unknown and cannot win on cache; with no trusted target, no ids or malformed ids it is least load, and
// x-rolter-decision says which (docs/architecture.md, "Routing rules").
type preciseCacheAware struct {
	threshold float64
	kv        *kvState
	ids       []int // route target -> kv id
}

func newPrecise(r *Route, p RouteParams, kv *kvState) (*preciseCacheAware, error) {
	if kv == nil {
		return nil, fmt.Errorf("BUG: no KV event state for route %q", r.Model)
	}
	s := &preciseCacheAware{threshold: defaultThreshold, kv: kv}
	if p.Threshold != nil {
		s.threshold = *p.Threshold
	}
	for _, t := range r.Targets {
		s.ids = append(s.ids, kv.ids[t.Provider.Name])
	}
	return s, nil
}

func (s *preciseCacheAware) Rank(p *Pick, out []int) (int, Decision) {
	switch p.TokenIDsState {
	case tokenIDsAbsent:
		out[0], _ = leastLoaded(p)
		return 1, decide(ReasonNoTokenIDs)
	case tokenIDsMalformed:
		out[0], _ = leastLoaded(p)
		return 1, decide(ReasonBadTokenIDs)
	}
	resident := p.kvOut[:s.kv.ix.MaxTargets()]
	s.kv.ix.Match(p.TokenIDs, p.kvScratch, resident)
	targets := p.Route.Targets
	best, bestScore, ties, trusted := -1, -1.0, uint64(0), false
	var bestLoad int64
	minLoad := int64(-1)
	for _, i := range p.Eligible {
		l := targets[i].Load()
		if minLoad < 0 || l < minLoad {
			minLoad = l
		}
		id := s.ids[i]
		if !s.kv.streams[id].Trusted() {
			continue
		}
		trusted = true
		score := 0.0
		if full := len(p.TokenIDs) / s.kv.ix.BlockSize(id); full > 0 {
			score = float64(resident[id]) / float64(full)
		}
		// Targets holding the same number of blocks are ties: the less loaded wins, then chance.
		switch {
		case score > bestScore || (score == bestScore && l < bestLoad):
			best, bestScore, bestLoad, ties = i, score, l, 1
		case score == bestScore && l == bestLoad:
			ties++
			if rand.Uint64N(ties) == 0 {
				best = i
			}
		}
	}
	if !trusted {
		out[0], _ = leastLoaded(p)
		return 1, decide(ReasonUntrusted)
	}
	reason := ReasonNoMatch
	if bestScore > 0 && bestScore >= s.threshold {
		if !overloaded(bestLoad, minLoad) {
			out[0] = best
			return 1, Decision{Reason: ReasonPrefixHit, Score: bestScore}
		}
		reason = ReasonOverloaded
	}
	out[0], _ = leastLoaded(p)
	return 1, Decision{Reason: reason, Score: bestScore}
}

// parseTokenIDs parses x-rolter-vllm-token-ids strictly: decimal ids separated by single commas, each at
// most 2^32-1. Anything else (spaces, signs, empty items, overflow) is malformed and the header is ignored.
func parseTokenIDs(dst []uint32, h []byte) ([]uint32, bool) {
	var v uint64
	digits := 0
	for _, c := range h {
		switch {
		case c >= '0' && c <= '9':
			v = v*10 + uint64(c-'0')
			digits++
			if v > 1<<32-1 {
				return dst, false
			}
		case c == ',':
			if digits == 0 {
				return dst, false
			}
			dst = append(dst, uint32(v))
			v, digits = 0, 0
		default:
			return dst, false
		}
	}
	if digits == 0 {
		return dst, false
	}
	return append(dst, uint32(v)), true
}

var _ Strategy = (*preciseCacheAware)(nil)
