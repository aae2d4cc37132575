package engine

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/kvindex"
	"github.com/rolter-ai/rolter/telemetry"
)

// Shadow strategies ([routes.shadow]; docs/architecture.md, "Routing evidence") rank every request of a
// route beside the live strategy, without moving traffic, so an operator can see what another strategy
// would have done before switching to it.
//
// Each shadow keeps its own counterfactual state: its own prefix tries and session bindings (what it
// would have learnt from its own picks), and its own in-flight counts (a shadow pick counts on its
// target from the live request's start to its end, so "load" is the load its own picks would have made).
// Evidence that comes from the engines - KV events for precise_cache_aware, LMCache occupancy - is the
// fleet's real state, which the live routing shaped; a shadow reads it as it is.
//
// The work is off the request path: the request copies its prompt key into a free buffer and queues it to
// the route's shadow goroutine (no free buffer or slot: the shadow run is dropped and counted); at its end
// it queues where it went. The goroutine is woken once per batch, not per message, and lingers a moment
// before draining, so a request pays a buffered channel send and an atomic load, not a goroutine wake-up.
// The queue holds two messages per slot, so queueing never blocks and an end is never lost. A shadow that
// is slower than the traffic falls behind by at most the buffers, then drops.

// shadowSlots bounds the requests in flight the shadows follow at once (a slot is small: the shadows'
// picks); shadowBufs the prompt keys waiting to be ranked, each at most maxShadowKey bytes (a longer key is
// cut: the shadows score its first maxShadowKey bytes). The copies are bounded by shadowBufs x maxShadowKey
// per route; a buffer keeps at most shadowBufKeep bytes between uses.
const (
	shadowSlots     = 4096
	shadowBufs      = 128
	maxShadowKey    = 256 << 10
	shadowBufKeep   = 64 << 10
	maxShadowTokens = 64 << 10
	maxShadowSessID = 256
	shadowLinger    = time.Millisecond
)

// shadowSet is one route's shadows and their goroutine. It lives as long as its snapshot.
type shadowSet struct {
	route   *Route // the live route
	shadows []*shadow
	free    chan *shadowSlot
	bufs    chan *shadowBuf
	queue   chan shadowMsg
	woken   atomic.Bool   // a wake-up is on its way: the goroutine will drain what is queued
	wake    chan struct{} // capacity 1
	dropped *metrics.Counter
	quit    chan struct{} // closed by stop
	done    chan struct{} // closed when run returns
	once    sync.Once

	// Worker scratch.
	pick      Pick
	out       [maxTargets]int
	eligible  [maxTargets]int
	matches   [maxTargets]int32
	kvScratch kvindex.Scratch
	kvOut     [kvindex.MaxTargets]int
	tmp       [maxTargets]int
	liveCoV   *ewma
}

// shadow is one shadow strategy of a route.
type shadow struct {
	name     string
	strategy Strategy
	recorder Recorder
	route    *Route // its own targets: the live route's, over counterfactual providers
	inflight []*atomic.Int64
	m        shadowMetrics
	cov      *ewma
}

type shadowMetrics struct {
	ranked, ended, agreed  *metrics.Counter
	scored, held, captured *metrics.Counter
}

// shadowSlot carries one request to the shadows and remembers their picks until the request ends.
type shadowSlot struct {
	buf      *shadowBuf // until ranked
	opening  int        // Pick.Opening, within the copied key
	tokState tokenIDsState
	eligible uint64
	now      int64
	picks    [config.MaxShadows]int8 // -1: the shadow did not rank it
}

// shadowBuf holds what the shadows read of a request until they ranked it.
type shadowBuf struct {
	key    []byte
	sess   []byte
	tokens []uint32
}

// shadowMsg is a request's start or its end.
type shadowMsg struct {
	slot *shadowSlot
	end  bool
	// At the end: the target that answered (-1: none) and whether the response succeeded.
	served int
	ok     bool
}

// newShadowSet builds the shadows of r. env is the live route's build environment; a shadow's series go to
// env.set under shadow=<name>, and its tries' gauges nowhere (the live ones are the route's).
func newShadowSet(r *Route, names []string, prev *shadowSet, env *buildEnv) (*shadowSet, error) {
	ss := &shadowSet{
		route:   r,
		free:    make(chan *shadowSlot, shadowSlots),
		bufs:    make(chan *shadowBuf, shadowBufs),
		queue:   make(chan shadowMsg, 2*shadowSlots),
		wake:    make(chan struct{}, 1),
		quit:    make(chan struct{}),
		done:    make(chan struct{}),
		liveCoV: newEWMA(),
	}
	for range shadowSlots {
		ss.free <- &shadowSlot{}
	}
	for range shadowBufs {
		ss.bufs <- &shadowBuf{}
	}
	rl := "route=" + telemetry.Label(r.Model)
	ss.dropped = env.set.Counter(telemetry.ShadowDropped, rl)
	env.set.Gauge(telemetry.ShadowLoadCoV, rl+`,shadow="live"`, ss.liveCoV.value)
	quiet := *env
	for _, name := range names {
		// A set never registered: a shadow's trie and session gauges would repeat the live ones' names.
		quiet.set = telemetry.NewSet()
		sr := &Route{Model: r.Model, StrategyName: name, org: r.org, modelBytes: r.modelBytes}
		sh := &shadow{name: name, route: sr, cov: newEWMA()}
		for _, t := range r.Targets {
			// A provider of its own, with the live one's identity and evidence sources but a counterfactual
			// in-flight count and no engine-reported load (that load is the live routing's).
			var n atomic.Int64
			p := &Provider{Name: t.Provider.Name, nameBytes: t.Provider.nameBytes, cfg: t.Provider.cfg,
				inflight: &n, picked: new(atomic.Int64), cache: t.Provider.cache, health: t.Provider.health, lmcache: t.Provider.lmcache}
			sh.inflight = append(sh.inflight, &n)
			sr.Targets = append(sr.Targets, &Target{Index: t.Index, Provider: p, Model: t.Model, modelJSON: t.modelJSON, Weight: t.Weight})
		}
		quiet.prev = nil
		if prev != nil {
			for _, old := range prev.shadows {
				if old.name == name {
					quiet.prev = old.route
				}
			}
		}
		var params config.RouteParams
		if config.Strategies[name].UsesTries {
			// Counted by trieShare: the share, not the strategy's own default.
			params.MaxTrieNodes, params.MaxTrieBytes = &quiet.trieNodes, &quiet.trieBytes
		}
		st, err := strategies[name](sr, params, &quiet)
		if err != nil {
			return nil, err
		}
		sr.Strategy = st
		sh.strategy = st
		sh.recorder, _ = st.(Recorder)
		l := rl + ",shadow=" + telemetry.Label(name)
		sh.m = shadowMetrics{
			ranked:   env.set.Counter(telemetry.ShadowRanked, l),
			agreed:   env.set.Counter(telemetry.ShadowAgreed, l),
			ended:    env.set.Counter(telemetry.ShadowEnded, l),
			scored:   env.set.Counter(telemetry.ShadowReuseScored, l),
			held:     env.set.Counter(telemetry.ShadowReuseHeld, l),
			captured: env.set.Counter(telemetry.ShadowReuseCaptured, l),
		}
		env.set.Gauge(telemetry.ShadowLoadCoV, l, sh.cov.value)
		ss.shadows = append(ss.shadows, sh)
	}
	return ss, nil
}

// start runs the shadows' goroutine; stop ends it once every request of the snapshot has ended (the
// snapshot retired), so every message was queued before.
func (ss *shadowSet) start() {
	for _, sh := range ss.shadows {
		if lc, ok := sh.strategy.(lifecycle); ok {
			lc.Start()
		}
	}
	go ss.run()
}

func (ss *shadowSet) stop() {
	ss.once.Do(func() {
		close(ss.quit)
		<-ss.done
		for _, sh := range ss.shadows {
			if lc, ok := sh.strategy.(lifecycle); ok {
				lc.Stop()
			}
		}
	})
}

// enqueue hands a request to the shadows, or returns nil when no slot or buffer is free (dropped and
// counted). It copies what the shadows read: the request's buffers are reused once it ends.
func (ss *shadowSet) enqueue(p *Pick) *shadowSlot {
	var sl *shadowSlot
	select {
	case sl = <-ss.free:
	default:
		ss.dropped.Inc()
		return nil
	}
	var b *shadowBuf
	select {
	case b = <-ss.bufs:
	default:
		ss.free <- sl
		ss.dropped.Inc()
		return nil
	}
	b.key = append(b.key[:0], p.Key[:min(len(p.Key), maxShadowKey)]...)
	b.sess = append(b.sess[:0], p.SessionID[:min(len(p.SessionID), maxShadowSessID)]...)
	sl.tokState = p.TokenIDsState
	b.tokens = b.tokens[:0]
	if p.TokenIDsState == tokenIDsOK {
		if len(p.TokenIDs) > maxShadowTokens {
			sl.tokState = tokenIDsMalformed
		} else {
			b.tokens = append(b.tokens, p.TokenIDs...)
		}
	}
	sl.buf, sl.eligible, sl.now = b, p.EligibleMask, p.Now
	sl.opening = min(p.Opening, len(b.key))
	ss.queue <- shadowMsg{slot: sl} // room for it: at most two messages per slot are ever queued
	ss.kick()
	return sl
}

// ended tells the shadows where the request went; served is -1 when no target answered. The queue has
// room for it (two messages per slot); only after stop, at gateway shutdown, can it be full, and then the
// message is dropped.
func (ss *shadowSet) ended(sl *shadowSlot, served int, ok bool) {
	select {
	case ss.queue <- shadowMsg{slot: sl, end: true, served: served, ok: ok}:
		ss.kick()
	default:
	}
}

// kick wakes the goroutine unless a wake-up is already on its way. The goroutine clears woken before it
// drains, so a message queued after that clear sends a new wake-up and none is left waiting.
func (ss *shadowSet) kick() {
	if !ss.woken.Load() && ss.woken.CompareAndSwap(false, true) {
		select {
		case ss.wake <- struct{}{}:
		default:
		}
	}
}

func (ss *shadowSet) run() {
	defer close(ss.done)
	linger := time.NewTimer(shadowLinger)
	linger.Stop()
	for {
		select {
		case <-ss.wake:
		case <-ss.quit:
			ss.drain(true)
			return
		}
		// Let a batch gather: one wake-up serves every request of the next moment.
		linger.Reset(shadowLinger)
		select {
		case <-linger.C:
		case <-ss.quit:
			ss.drain(true)
			return
		}
		ss.woken.Store(false)
		ss.drain(false)
	}
}

// drain handles every queued message. Stopping, it ranks nothing more (a slow shadow's backlog must not
// hold up a reload or a shutdown) but still counts the ends.
func (ss *shadowSet) drain(stopping bool) {
	for {
		select {
		case msg := <-ss.queue:
			if !stopping {
				select {
				case <-ss.quit:
					stopping = true
				default:
				}
			}
			switch {
			case msg.end:
				ss.end(msg)
			case stopping:
				for k := range ss.shadows {
					msg.slot.picks[k] = -1
				}
				ss.bufs <- msg.slot.buf
				msg.slot.buf = nil
			default:
				ss.rank(msg.slot)
			}
		default:
			return
		}
	}
}

// rank runs every shadow on one request, as the live strategy ran: on the eligible targets of that moment.
func (ss *shadowSet) rank(sl *shadowSlot) {
	p := &ss.pick
	n := len(ss.route.Targets)
	b := sl.buf
	for k, sh := range ss.shadows {
		*p = Pick{Route: sh.route, Key: b.key, Opening: sl.opening, SessionID: b.sess, Now: sl.now, EligibleMask: sl.eligible,
			TokenIDsState: sl.tokState, kvScratch: &ss.kvScratch, kvOut: ss.kvOut[:], tmp: ss.tmp[:0]}
		if sl.tokState == tokenIDsOK {
			p.TokenIDs = b.tokens
		}
		p.Eligible = ss.eligible[:0]
		for i := range n {
			if sl.eligible&(1<<i) != 0 {
				p.Eligible = append(p.Eligible, i)
			}
		}
		p.Matches = ss.matches[:n]
		sl.picks[k] = -1
		if len(p.Eligible) == 0 {
			continue
		}
		cnt, _ := sh.strategy.Rank(p, ss.out[:])
		if cnt < 1 {
			continue
		}
		t := ss.out[0]
		sl.picks[k] = int8(t)
		sh.inflight[t].Add(1)
		if sh.recorder != nil {
			sh.recorder.Routed(p, t)
		}
		sh.m.ranked.Inc()
		if p.MatchOf > 0 {
			held, captured := p.predicted(t)
			sh.m.scored.Add(p.MatchOf)
			sh.m.held.Add(int(held))
			sh.m.captured.Add(int(captured))
		}
		sh.cov.add(loadCoV(sh.inflight, sl.eligible))
	}
	*p = Pick{}
	if cap(b.key) > shadowBufKeep {
		b.key = nil // a buffer keeps a small array, not the largest key it ever held
	}
	if cap(b.tokens) > shadowBufKeep/4 {
		b.tokens = nil
	}
	sl.buf = nil
	ss.bufs <- b
	live := ss.route.Targets
	var loads [maxTargets]int64
	for i, t := range live {
		loads[i] = t.Provider.Inflight()
	}
	ss.liveCoV.add(cov(loads[:len(live)], sl.eligible))
}

// end releases the request's counterfactual load and counts whether each shadow agreed with the target
// that answered.
func (ss *shadowSet) end(msg shadowMsg) {
	sl := msg.slot
	for k, sh := range ss.shadows {
		t := sl.picks[k]
		if t < 0 {
			continue
		}
		sh.inflight[t].Add(-1)
		if msg.ok {
			sh.m.ended.Inc()
			if int(t) == msg.served {
				sh.m.agreed.Inc()
			}
		}
	}
	ss.free <- sl
}

// loadCoV is the coefficient of variation (stddev / mean) of the in-flight counts of the eligible targets:
// 0 when the load is even; 0 as well when nothing is in flight.
func loadCoV(inflight []*atomic.Int64, eligible uint64) float64 {
	var loads [maxTargets]int64
	for i, n := range inflight {
		loads[i] = n.Load()
	}
	return cov(loads[:len(inflight)], eligible)
}

func cov(loads []int64, eligible uint64) float64 {
	var sum, sq float64
	n := 0
	for i, l := range loads {
		if eligible&(1<<i) == 0 {
			continue
		}
		f := float64(l)
		sum += f
		sq += f * f
		n++
	}
	if n == 0 || sum == 0 {
		return 0
	}
	mean := sum / float64(n)
	return math.Sqrt(max(sq/float64(n)-mean*mean, 0)) / mean
}
