package engine

import (
	"crypto/sha256"
	"fmt"
	"github.com/rolter-ai/rolter/limits"
	"io"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/egress"
	"github.com/rolter-ai/rolter/telemetry"
	"github.com/rolter-ai/rolter/trie"
)

// A Snapshot is the config with its runtime objects: providers, routes with their targets and strategies,
// the KV-event sources they use. It is immutable once published; requests load the live one once
// (Gateway.acquireSnapshot) and finish on it, whatever reload happens meanwhile.
//
// Life of a snapshot (docs/architecture.md, "Reload"):
//
//   - build (Gateway.buildSnapshot): every component whose identity is unchanged from the live snapshot is
//     taken over - the same Provider object (pool, in-flight count, health, pollers), the same tries and
//     session bindings for surviving route targets, the same KV-event subscription - and the rest is new;
//   - publish (Gateway.publish): new components are started and their metric series registered, the
//     snapshot is stored with one atomic store, and the one it replaced starts retiring;
//   - retire: once the last request that started on it has finished (streams included), every component it
//     holds is released; a component no published snapshot holds any more is stopped and its metric series
//     unregistered.
type Snapshot struct {
	cfg       *config.Config
	gen       uint64 // generation: 1 for the config the gateway started with, +1 per reload
	Providers []*Provider
	providers map[string]*Provider
	routes    map[string]*Route
	Routes    []*Route // sorted by model, for /v1/models
	models    []byte   // the /v1/models body
	// set holds the series that belong to this snapshot alone: the strategies' gauges (trie sizes,
	// session counts). It is swapped with the snapshot.
	set *telemetry.Set
	// series are the route and target metric series the snapshot holds (carried over by their labels).
	series []*series
	// kv are the KV-event sources of the providers its precise_cache_aware routes use, by provider name.
	kv map[string]*kvSource
	// keys maps the keyed hash of each data-plane key to its org; pepper is the key of that hash.
	// orgModels are the /v1/models bodies a key of each org sees (its routes and the public ones).
	keys   map[[32]byte]*dataKey
	pepper [32]byte
	// orgLimits are the orgs' limits by org id (nil: none), scopes every limit scope by its subject and
	// limits (carried over a reload), defaultMaxTokens the completion a request without max_tokens reserves
	// (limits.go).
	orgLimits        map[string]*scopeSet
	scopes           map[string]*limits.Scope
	defaultMaxTokens int64
	orgModels        map[string][]byte
	// orgLabels maps the route and target label values (escaped, unquoted) of the orgs' routes and
	// providers to their org: the anonymous /metrics leaves their series out (WriteMetrics).
	orgLabels map[string]string

	// users is written twice per request from every core: on a cache line of its own, so that the
	// read-mostly fields above stay shared in every core's cache.
	_        [64]byte
	users    atomic.Int64 // requests running on the snapshot
	_        [56]byte
	retiring atomic.Bool
	drained  chan struct{} // closed once retiring and users is 0
	drain    sync.Once
}

// Target is one (provider, upstream model) of a route.
type Target struct {
	Index    int
	Provider *Provider
	Model    string
	// modelJSON is Model as a JSON string literal, spliced into forwarded bodies.
	modelJSON []byte
	Weight    float64
	m         *telemetry.TargetMetrics
	gap       *ewma
	// peerID names the engine in the evidence shared with other replicas (PeerID), and seeds its weight in
	// the rendezvous hash that gives a conversation no target holds its home (homeOf).
	peerID uint64
}

// Load is the target's provider load.
func (t *Target) Load() int64 { return t.Provider.Load() }

// Route is one public model name.
type Route struct {
	Model        string
	StrategyName string
	Strategy     Strategy
	Targets      []*Target
	recorder     Recorder
	shadows      *shadowSet // [routes.shadow], or nil
	// staleGap and staleWindow are the stale loop's parameters (lifecycle.go); staleGap 0: off.
	staleGap    float64
	staleWindow int
	// tries are the strategy's prefix tries, one per target (nil for a strategy without them).
	tries []*trie.Trie
	m     *telemetry.RouteMetrics
	// pd is the decode pool and protocol of a disaggregated route, nil for others (disagg.go).
	pd *pdRoute
	// lora is the adapter side of a route made for a LoRA adapter (lora.go), nil for others.
	lora *loraRoute
	// bound is the route's load bound (bound.go), nil when off.
	bound *loadBound
	// strategyHeader and modelBytes are the x-rolter-strategy and x-rolter-route values.
	strategyHeader []byte
	modelBytes     []byte
	// org owns the route ("" for public ones); keyed says a request must carry one of the org's
	// data-plane keys: always, for an org's route - an org without (valid) keys serves nobody, so revoking
	// its last key can never open its routes to everyone.
	org   string
	keyed bool
}

// target returns the index of the target of r with the given provider and upstream model, or -1.
func (r *Route) target(provider, model string) int {
	for i, t := range r.Targets {
		if t.Provider.Name == provider && t.Model == model {
			return i
		}
	}
	return -1
}

// Route returns the route for a public model name, or nil. Looking up with string(b) does not allocate.
func (s *Snapshot) route(model []byte) *Route { return s.routes[string(model)] }

// keyOrg returns the org of the data-plane key in an Authorization header value ("Bearer <secret>"), using
// scratch for the hash input (it returns it, grown, for reuse). ok is false for a missing or unknown key.
// It does not allocate once scratch has room.
func (s *Snapshot) keyOrg(auth, scratch []byte) (org string, ok bool, _ []byte) {
	k, scratch := s.key(auth, scratch)
	if k == nil {
		return "", false, scratch
	}
	return k.org, true, scratch
}

// key returns the data-plane key of an Authorization header value, or nil, as keyOrg.
func (s *Snapshot) key(auth, scratch []byte) (*dataKey, []byte) {
	const bearer = "bearer "
	if len(auth) <= len(bearer) || !equalFold(auth[:len(bearer)], bearer) || len(s.keys) == 0 {
		return nil, scratch
	}
	scratch = append(append(scratch[:0], s.pepper[:]...), auth[len(bearer):]...)
	return s.keys[sha256.Sum256(scratch)], scratch
}

// Config returns the snapshot's config. It must not be modified.
func (s *Snapshot) Config() *config.Config { return s.cfg }

// Generation returns the snapshot's config generation.
func (s *Snapshot) Generation() uint64 { return s.gen }

var failKindLabels = failKindNames[:]

var reasonLabels = reasonNames[:]

// series are metric series that outlive snapshots by their labels: a route's metrics (route, strategy) and
// a target's (route, provider) keep counting across reloads for as long as some published snapshot has a
// route or target with those labels.
type series struct {
	key    string
	set    *telemetry.Set
	route  *telemetry.RouteMetrics
	target *telemetry.TargetMetrics
	pd     *telemetry.DisaggMetrics
	gap    *ewma // a target's recent gap between predicted and delivered reuse (usage.go)
	holds  int   // as Provider.holds
}

// buildSnapshot turns a validated config into runtime objects, taking over from prev (the live snapshot,
// nil at start) whatever is unchanged. Nothing is started or registered: publish does that. On error
// everything made for it is released and prev is untouched. Called under g.reloadMu.
func (g *Gateway) buildSnapshot(cfg *config.Config, prev *Snapshot) (_ *Snapshot, err error) {
	s := &Snapshot{
		cfg:       cfg,
		providers: make(map[string]*Provider, len(cfg.Providers)),
		routes:    make(map[string]*Route, len(cfg.Routes)),
		set:       telemetry.NewSet(),
		kv:        map[string]*kvSource{},
		drained:   make(chan struct{}),
	}
	var newSources []*kvSource
	var newSeries []*series
	defer func() {
		// A bug here must not kill the gateway (a SIGHUP) or leave a change the gateway cannot take in the
		// control plane's store: it refuses the config, and the running one keeps serving.
		if r := recover(); r != nil {
			g.log.Error("BUG: panic while building a config snapshot", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = fmt.Errorf("BUG: cannot build the config: %v", r)
		}
		if err == nil {
			return
		}
		for _, p := range s.Providers {
			if p.holds == 0 {
				p.stop()
			}
		}
		for _, src := range newSources {
			g.kv.drop(src)
		}
		for _, se := range newSeries {
			delete(g.series, se.key)
		}
	}()
	env := &buildEnv{set: s.set, log: g.log, cfg: cfg, dial: g.dial, budget: g.conns, kvSources: s.kv}
	policy, err := egress.New(cfg.Egress)
	if err != nil {
		return nil, fmt.Errorf("cannot use [egress]: %w", err)
	}
	env.egress = g.egressDialers(policy)

	fleet := &fleetHealth{maxPercent: cfg.Health.MaxEjectionPercent}
	for i := range cfg.Providers {
		pc := &cfg.Providers[i]
		var old *Provider
		if prev != nil {
			old = prev.providers[pc.Name]
		}
		p := old
		if p == nil || !p.sameAs(pc, cfg) {
			if p, err = newProvider(pc, cfg, env, old); err != nil {
				return nil, err
			}
		}
		fleet.members = append(fleet.members, p.health)
		s.Providers = append(s.Providers, p)
		s.providers[p.Name] = p
	}

	// KV-event sources, for the providers that precise_cache_aware routes use. Their settings come from cfg,
	// never from a carried-over Provider (which holds none).
	kvConfigs := make(map[string]*config.ProviderConfig, len(cfg.Providers))
	for i := range cfg.Providers {
		kvConfigs[cfg.Providers[i].Name] = &cfg.Providers[i]
	}
	for _, rc := range cfg.Routes {
		if !rc.NeedsKVEvents() {
			continue
		}
		for _, tc := range rc.Targets {
			if _, ok := s.kv[tc.Provider]; ok {
				continue
			}
			if g.kv == nil {
				if g.kv, err = newKVState(g.log); err != nil {
					return nil, err
				}
			}
			pc := kvConfigs[tc.Provider]
			if pc == nil || pc.KVEvents == nil {
				return nil, fmt.Errorf("BUG: provider %q has no kv_events, which validation requires", tc.Provider)
			}
			kc, err := kvEndpoints(pc.KVEvents, env.egress[useKV])
			if err != nil {
				return nil, fmt.Errorf("cannot subscribe to the KV events of provider %q: %w", tc.Provider, err)
			}
			src, fresh, err := g.kv.source(tc.Provider, kc, pc.CurveKey(cfg.Control.ProviderEnv))
			if err != nil {
				return nil, err
			}
			if fresh {
				newSources = append(newSources, src)
			}
			s.kv[tc.Provider] = src
		}
	}
	env.kv = g.kv

	seriesFor := func(key string, make func(set *telemetry.Set, se *series)) *series {
		if se := g.series[key]; se != nil {
			return se
		}
		se := &series{key: key, set: telemetry.NewSet()}
		make(se.set, se)
		g.series[key] = se
		newSeries = append(newSeries, se)
		return se
	}
	trieNodes, trieBytes := cfg.TrieShare()
	env.trieNodes, env.trieBytes = trieNodes, trieBytes
	for _, rc := range cfg.ServedRoutes() {
		r := &Route{Model: rc.Model, StrategyName: rc.Strategy, strategyHeader: []byte(rc.Strategy), modelBytes: []byte(rc.Model), org: rc.Org}
		rs := seriesFor("route\x00"+rc.Model+"\x00"+rc.Strategy, func(set *telemetry.Set, se *series) {
			se.route = set.NewRouteMetrics(rc.Model, rc.Strategy, reasonLabels)
		})
		r.m = rs.route
		s.series = append(s.series, rs)
		newTarget := func(j int, tc config.TargetConfig) *Target {
			p := s.providers[tc.Provider]
			ts := seriesFor("target\x00"+rc.Model+"\x00"+p.Name, func(set *telemetry.Set, se *series) {
				se.target = set.NewTargetMetrics(rc.Model, p.Name, failKindLabels)
				se.gap = newEWMA()
				set.ReuseGap(rc.Model, p.Name, se.gap.value)
			})
			if !slices.Contains(s.series, ts) {
				s.series = append(s.series, ts)
			}
			return &Target{
				Index:     j,
				Provider:  p,
				Model:     tc.Model,
				modelJSON: appendJSONString(nil, tc.Model),
				peerID:    PeerID(p.Name, tc.Model),
				Weight:    *tc.Weight,
				m:         ts.target,
				gap:       ts.gap,
			}
		}
		for j, tc := range rc.Targets {
			r.Targets = append(r.Targets, newTarget(j, tc))
		}
		if dc := rc.Disaggregation; dc != nil {
			ds := seriesFor("disagg\x00"+rc.Model, func(set *telemetry.Set, se *series) {
				se.pd = set.NewDisaggMetrics(rc.Model)
			})
			s.series = append(s.series, ds)
			r.pd = newPDRoute(dc, ds.pd, newTarget)
		}
		if len(r.Targets) == 0 {
			// Every target of the route comes from discovery sources that have found no engine yet: it has no
			// strategy to build, and answers 503 until they do (prepare).
			s.routes[r.Model] = r
			s.Routes = append(s.Routes, r)
			continue
		}
		spec := config.Strategies[rc.Strategy]
		params := rc.Params
		if spec.UsesTries {
			if params.MaxTrieNodes == nil {
				params.MaxTrieNodes = &trieNodes
			}
			if params.MaxTrieBytes == nil {
				params.MaxTrieBytes = &trieBytes
			}
		}
		env.prev = nil
		if prev != nil {
			env.prev = prev.routes[rc.Model]
		}
		st, err := strategies[rc.Strategy](r, params, env)
		if err != nil {
			return nil, fmt.Errorf("cannot build strategy %q for route %q: %w", rc.Strategy, rc.Model, err)
		}
		r.Strategy = st
		r.recorder, _ = st.(Recorder)
		r.bound = newLoadBound(r, routeLoadBound(rc.Strategy, rc.Params))
		if rc.LoRABase != "" {
			r.lora = newLoRARoute(r, &rc, env.prev)
			registerLoRAMetrics(env.set, r)
		}
		if h, ok := st.(trieHolder); ok {
			r.tries = h.triesOf()
		}
		registerEvidence(env.set, r)
		if spec.UsesTries {
			r.staleGap, r.staleWindow = defaultStaleGap, defaultStaleWindow
			if rc.Params.StaleGap != nil {
				r.staleGap = *rc.Params.StaleGap
			}
			if rc.Params.StaleWindow != nil {
				r.staleWindow = *rc.Params.StaleWindow
			}
		}
		if rc.Shadow != nil && len(rc.Shadow.Strategies) > 0 {
			var prevShadows *shadowSet
			if env.prev != nil {
				prevShadows = env.prev.shadows
			}
			if r.shadows, err = newShadowSet(r, rc.Shadow.Strategies, prevShadows, env); err != nil {
				return nil, fmt.Errorf("cannot build the shadow strategies of route %q: %w", rc.Model, err)
			}
		}
		s.routes[r.Model] = r
		s.Routes = append(s.Routes, r)
	}
	sort.Slice(s.Routes, func(a, b int) bool { return s.Routes[a].Model < s.Routes[b].Model })
	s.pepper = cfg.KeyPepper
	s.buildLimits(cfg, prev, g.limitShare.Load())
	created := time.Now().Unix()
	var public []*Route
	byOrg := map[string][]*Route{}
	for _, r := range s.Routes {
		r.keyed = r.org != ""
		if !r.keyed {
			public = append(public, r)
		} else {
			byOrg[r.org] = append(byOrg[r.org], r)
		}
	}
	s.orgLabels = map[string]string{}
	for _, r := range s.Routes {
		if r.org != "" {
			s.orgLabels["route\x00"+unquote(telemetry.Label(r.Model))] = r.org
		}
	}
	for _, p := range s.Providers {
		if p.cfg.Org != "" {
			s.orgLabels["target\x00"+unquote(telemetry.Label(p.Name))] = p.cfg.Org
		}
	}
	s.models = modelsBody(public, created)
	s.orgModels = map[string][]byte{}
	for org, rs := range byOrg {
		all := append(append([]*Route(nil), public...), rs...)
		sort.Slice(all, func(a, b int) bool { return all[a].Model < all[b].Model })
		s.orgModels[org] = modelsBody(all, created)
	}
	// The ejection cap counts this snapshot's providers; carried providers move over to it.
	for _, p := range s.Providers {
		p.health.fleet.Store(fleet)
	}
	return s, nil
}

// publish makes s the live snapshot: it starts what is new in it and registers its metric series, stores
// it, and retires the snapshot it replaces. Called under g.reloadMu.
func (g *Gateway) publish(s *Snapshot) {
	old := g.snap.Load()
	if old != nil {
		// Series of the same name must not be exported twice: what s replaces under the same labels goes
		// out now, before s's series come in.
		old.set.Unregister()
		for _, p := range old.Providers {
			if q := s.providers[p.Name]; q != nil && q != p && p.registered {
				p.set.Unregister()
				p.registered = false
			}
		}
		for name, src := range old.kv {
			if q := s.kv[name]; q != nil && q != src && src.registered {
				src.set.Unregister()
				src.registered = false
			}
		}
	}
	for _, p := range s.Providers {
		if p.holds == 0 {
			p.start()
			p.set.Register()
			p.registered = true
		}
		p.holds++
	}
	for _, src := range s.kv {
		if src.holds == 0 {
			src.set.Register()
			src.registered = true
			g.kv.current[src.name] = src
		}
		src.holds++
	}
	for _, se := range s.series {
		if se.holds == 0 {
			se.set.Register()
		}
		se.holds++
	}
	for _, r := range s.Routes {
		if lc, ok := r.Strategy.(lifecycle); ok {
			lc.Start()
		}
		if r.shadows != nil {
			r.shadows.start()
		}
	}
	s.set.Register()
	g.snap.Store(s)
	if old != nil {
		g.retire(old)
	}
}

// retire waits, in the background, for the requests that started on s to finish, then releases what s
// holds. At gateway shutdown it stops waiting.
func (g *Gateway) retire(s *Snapshot) {
	s.retiring.Store(true)
	if s.users.Load() == 0 {
		s.drain.Do(func() { close(s.drained) })
	}
	g.retiring.Add(1)
	go func() {
		defer g.retiring.Done()
		select {
		case <-s.drained:
		case <-g.stop:
		}
		g.reloadMu.Lock()
		defer g.reloadMu.Unlock()
		g.release(s)
	}()
}

// release gives up what s holds: strategies stop, and every component no published snapshot holds any
// more is stopped and its series unregistered. Called under g.reloadMu.
func (g *Gateway) release(s *Snapshot) {
	for _, r := range s.Routes {
		if lc, ok := r.Strategy.(lifecycle); ok {
			lc.Stop()
		}
		if r.shadows != nil {
			r.shadows.stop()
		}
	}
	for _, p := range s.Providers {
		if p.holds--; p.holds == 0 {
			if p.registered {
				p.set.Unregister()
				p.registered = false
			}
			p.stop()
		}
	}
	for _, src := range s.kv {
		if src.holds--; src.holds == 0 {
			g.kv.drop(src)
		}
	}
	for _, se := range s.series {
		if se.holds--; se.holds == 0 {
			se.set.Unregister()
			delete(g.series, se.key)
		}
	}
}

// acquireSnapshot returns the live snapshot for a request, counted as one of its users until
// releaseSnapshot. A request never starts on a snapshot that is already retiring.
func (g *Gateway) acquireSnapshot() *Snapshot {
	for {
		s := g.snap.Load()
		s.users.Add(1)
		if !s.retiring.Load() {
			return s
		}
		// Published over between the load and the count: the retiring side may have seen no users.
		s.releaseUser()
	}
}

// releaseUser ends one request's use of s.
func (s *Snapshot) releaseUser() {
	if s.users.Add(-1) == 0 && s.retiring.Load() {
		s.drain.Do(func() { close(s.drained) })
	}
}

// Uses of the egress policy: the use label of rolter_egress_refused_total (telemetry.EgressUses).
const (
	useProxy = iota
	useHealth
	useScrape
	useLMCache
	useKV
	useTracing
	useCluster
	numUses
)

// egressDialers returns one dialer per use of the policy; each counts and logs what it refuses (at most
// one log line a second per use: a provider whose name re-resolves to a refused address is refused on
// every request).
func (g *Gateway) egressDialers(p *egress.Policy) (d [numUses]*egress.Dialer) {
	for use := range d {
		d[use] = g.egressDialer(p, use)
	}
	return d
}

// ClusterDialer returns a dialer of policy p for the cluster's NATS connections: what it refuses is counted
// as rolter_egress_refused_total{use="cluster"} and logged, like the gateway's own connections.
func (g *Gateway) ClusterDialer(p *egress.Policy) *egress.Dialer {
	return g.egressDialer(p, useCluster)
}

// egressDialer returns a dialer of the policy for one use.
func (g *Gateway) egressDialer(p *egress.Policy, use int) *egress.Dialer {
	var lastLog atomic.Int64
	return &egress.Dialer{Policy: p, Resolver: g.resolver, OnRefuse: func(r *egress.Refusal) {
		if g.global != nil {
			g.global.EgressRefused(use)
		}
		now := time.Now().UnixNano()
		if last := lastLog.Load(); now-last >= int64(time.Second) && lastLog.CompareAndSwap(last, now) {
			g.log.Warn("egress policy refused a connection", "use", telemetry.EgressUses[use], "error", r.Error())
		}
	}}
}

// modelsBody renders GET /v1/models: {"object":"list","data":[{"id","object":"model","created","owned_by"}]}.
func modelsBody(routes []*Route, created int64) []byte {
	var b []byte
	b = append(b, `{"object":"list","data":[`...)
	for i, r := range routes {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = appendJSONString(b, r.Model)
		b = append(b, fmt.Sprintf(`,"object":"model","created":%d,"owned_by":"rolter"}`, created)...)
	}
	return append(b, "]}"...)
}

// describe returns a one-line summary of the snapshot for logs.
func (s *Snapshot) describe() string {
	var parts []string
	for _, r := range s.Routes {
		parts = append(parts, fmt.Sprintf("%s(%s, %d targets)", r.Model, r.StrategyName, len(r.Targets)))
	}
	return strings.Join(parts, " ")
}

// unquote takes the quotes off a label value telemetry.Label made.
func unquote(l string) string { return l[1 : len(l)-1] }

// MetricsAll is the scope of WriteMetrics that writes every series.
const MetricsAll = "*"

// WriteMetrics writes the gateway's metrics in the Prometheus text format, as scope sees them: every
// series for MetricsAll; for an org id, only the series labelled with that org's routes and providers;
// for "" (the anonymous GET /metrics of the data plane), every series but those, so that a scrape names no
// org's route or provider. Safe for concurrent use.
func (g *Gateway) WriteMetrics(w io.Writer, scope string) {
	if scope == MetricsAll {
		telemetry.WritePrometheus(w)
		return
	}
	labels := g.snap.Load().orgLabels
	var key []byte
	telemetry.WritePrometheusKeeping(w, func(sample []byte) bool {
		// A key's usage names its org.
		if v, ok := telemetry.LabelValue(sample, "org"); ok {
			return string(v) == scope
		}
		org := ""
		for _, name := range [...]string{"route", "target"} {
			if v, ok := telemetry.LabelValue(sample, name); ok {
				key = append(append(append(key[:0], name...), 0), v...)
				if o, ok := labels[string(key)]; ok {
					org = o
					break
				}
			}
		}
		return org == scope
	})
}
