package engine

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rolter-ai/rolter/telemetry"
)

// Provider is the state shared by every target that points at one upstream engine: its connection pool,
// its in-flight counter (the load every strategy reads), and later its health. Config is in cfg; the
// mutable state is flat, padded atomics, read on every routing decision (docs/architecture.md,
// "Concurrency rules").
type Provider struct {
	Name      string
	nameBytes []byte
	Index     int
	cfg       ProviderConfig
	up        *upstream
	// auth is the Authorization header value sent upstream ("Bearer <key>"), or nil to pass the client's.
	auth []byte
	// headers are the configured extra headers, sorted by name; they replace client headers of the same name.
	headers [][2]string
	// headerNames are the names of headers, lower-cased.
	headerNames []string
	setsXFF     bool // headers include X-Forwarded-For

	_        [64]byte
	inflight atomic.Int64
	_        [56]byte

	// engineLoad, when set, returns the engine's requests (running + waiting, from its /metrics) that are not
	// this gateway's own, or 0 when that number is unknown or stale.
	engineLoad func() int64
	scraper    *telemetry.Scraper

	health  *providerHealth
	adm     *admission
	checker *healthChecker
	lmcache *lmcacheSource // nil unless [providers.lmcache] is set
}

// Load is the number of requests in flight from this gateway to the provider, plus - with [metrics_scrape]
// on and fresh - the engine's queue beyond them: its running + waiting requests minus this gateway's
// in-flight count when that scrape was read, i.e. other clients' load (docs/architecture.md, "Load"). Our
// own requests are counted once, by the fresh in-flight counter (updated at dispatch, not every scrape
// interval: routers whose load counters lagged sent every request to one worker, smg-project/smg#1714),
// so a stale scrape never makes a replica look busier than our own traffic made it.
func (p *Provider) Load() int64 {
	l := p.inflight.Load()
	if p.engineLoad != nil {
		l += p.engineLoad()
	}
	return l
}

// setsHeader reports whether the provider's configured headers include name (case-insensitively).
func (p *Provider) setsHeader(name []byte) bool {
	for _, h := range p.headerNames {
		if equalFold(name, h) {
			return true
		}
	}
	return false
}

// Inflight returns the gateway's own in-flight count for the provider.
func (p *Provider) Inflight() int64 { return p.inflight.Load() }

// Target is one (provider, upstream model) of a route.
type Target struct {
	Index    int
	Provider *Provider
	Model    string
	// modelJSON is Model as a JSON string literal, spliced into forwarded bodies.
	modelJSON []byte
	Weight    float64
	m         *telemetry.TargetMetrics
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
	m            *telemetry.RouteMetrics
	// strategyHeader and modelBytes are the x-rolter-strategy and x-rolter-route values.
	strategyHeader []byte
	modelBytes     []byte
}

// Snapshot is an immutable view of the config with its runtime objects; it is swapped whole.
type Snapshot struct {
	cfg       *Config
	Providers []*Provider
	providers map[string]*Provider
	routes    map[string]*Route
	Routes    []*Route // sorted by model, for /v1/models
	models    []byte   // the /v1/models body
	set       *telemetry.Set
	kv        *kvState // nil unless a route uses precise_cache_aware
}

// Route returns the route for a public model name, or nil. Looking up with string(b) does not allocate.
func (s *Snapshot) route(model []byte) *Route { return s.routes[string(model)] }

// Config returns the snapshot's config. It must not be modified.
func (s *Snapshot) Config() *Config { return s.cfg }

var failKindLabels = failKindNames[:]

var reasonLabels = reasonNames[:]

// buildSnapshot turns a validated config into runtime objects. dial, when non-nil, replaces TCP dialing.
func buildSnapshot(cfg *Config, dial func(string, time.Duration) (net.Conn, error), log *slog.Logger) (*Snapshot, error) {
	s := &Snapshot{
		cfg:       cfg,
		providers: make(map[string]*Provider, len(cfg.Providers)),
		routes:    make(map[string]*Route, len(cfg.Routes)),
		set:       telemetry.NewSet(),
	}
	fleet := &fleetHealth{maxPercent: cfg.Health.MaxEjectionPercent}
	for i, pc := range cfg.Providers {
		up, err := newUpstream(pc.Name, pc.APIBase, pc.MaxConns, cfg.Timeouts)
		if err != nil {
			return nil, err
		}
		up.dial = dial
		p := &Provider{Name: pc.Name, nameBytes: []byte(pc.Name), Index: i, cfg: pc, up: up, adm: newAdmission(cfg.Queue)}
		p.health = newProviderHealth(pc.Name, cfg, log, s.set)
		p.health.fleet = fleet
		fleet.members = append(fleet.members, p.health)
		if cfg.Health.Enabled {
			p.checker = newHealthChecker(p, cfg.Health, s.set)
		}
		if cfg.MetricsScrape.Enabled {
			p.startScrape(cfg, log, s.set)
		}
		if pc.LMCache != nil {
			p.lmcache = newLMCacheSource(p, log, s.set)
		}
		if pc.APIKeyEnv != "" {
			p.auth = []byte("Bearer " + os.Getenv(pc.APIKeyEnv))
		}
		for k, v := range pc.Headers {
			p.headers = append(p.headers, [2]string{k, v})
		}
		sort.Slice(p.headers, func(a, b int) bool { return p.headers[a][0] < p.headers[b][0] })
		for _, h := range p.headers {
			p.headerNames = append(p.headerNames, strings.ToLower(h[0]))
		}
		p.setsXFF = p.setsHeader([]byte("X-Forwarded-For"))
		s.Providers = append(s.Providers, p)
		s.providers[p.Name] = p
		l := "target=" + telemetry.Label(p.Name)
		s.set.Gauge(telemetry.InflightGauge, l, func() float64 { return float64(p.inflight.Load()) })
		s.set.Gauge(telemetry.UpstreamConns, l, func() float64 { return float64(up.open.Load()) })
		s.set.Gauge(telemetry.QueueWaiting, l, func() float64 { return float64(p.adm.waiting.Load()) })
	}
	kv, err := newKVState(s, log)
	if err != nil {
		return nil, err
	}
	s.kv = kv
	trieNodes, trieBytes := trieShare(cfg)
	for _, rc := range cfg.Routes {
		r := &Route{Model: rc.Model, StrategyName: rc.Strategy, strategyHeader: []byte(rc.Strategy), modelBytes: []byte(rc.Model)}
		r.m = s.set.NewRouteMetrics(rc.Model, rc.Strategy, reasonLabels)
		for j, tc := range rc.Targets {
			p := s.providers[tc.Provider]
			t := &Target{
				Index:     j,
				Provider:  p,
				Model:     tc.Model,
				modelJSON: appendJSONString(nil, tc.Model),
				Weight:    *tc.Weight,
				m:         s.set.NewTargetMetrics(rc.Model, p.Name, failKindLabels),
			}
			r.Targets = append(r.Targets, t)
		}
		spec := strategies[rc.Strategy]
		params := rc.Params
		if spec.usesTries {
			if params.MaxTrieNodes == nil {
				params.MaxTrieNodes = &trieNodes
			}
			if params.MaxTrieBytes == nil {
				params.MaxTrieBytes = &trieBytes
			}
		}
		st, err := spec.build(r, params, &buildEnv{set: s.set, log: log, cfg: cfg, kv: kv})
		if err != nil {
			return nil, fmt.Errorf("cannot build strategy %q for route %q: %w", rc.Strategy, rc.Model, err)
		}
		r.Strategy = st
		r.recorder, _ = st.(Recorder)
		s.routes[r.Model] = r
		s.Routes = append(s.Routes, r)
	}
	sort.Slice(s.Routes, func(a, b int) bool { return s.Routes[a].Model < s.Routes[b].Model })
	s.models = modelsBody(s.Routes, time.Now().Unix())
	return s, nil
}

// trieShare returns the default ceilings of one target's prefix trie: an equal share of
// [server] routing_memory_bytes for every target of a route that keeps tries and does not set both ceilings
// itself. A trie costs about 58 bytes per node plus 1.2 bytes per stored prompt byte (trie package
// benchmarks), so a share S allows 0.4 S stored bytes and 0.5 S / 64 nodes: at most about 0.95 S in all.
// With the 512 MiB default and 8 targets that is 26.8 MB of prompt text and 524,288 nodes per target. The
// node count never goes above the seed page's 1 million.
func trieShare(cfg *Config) (nodes, bytes int) {
	n := 0
	for _, rc := range cfg.Routes {
		if strategies[rc.Strategy].usesTries && (rc.Params.MaxTrieNodes == nil || rc.Params.MaxTrieBytes == nil) {
			n += len(rc.Targets)
		}
	}
	share := cfg.Server.RoutingMemoryBytes / max(n, 1)
	nodes = min(max(share/2/64, 16), defaultMaxTrieNodes)
	bytes = max(share*2/5, 1024)
	return nodes, bytes
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

// start starts health checkers and strategies' background work.
func (s *Snapshot) start() error {
	for _, p := range s.Providers {
		if p.checker != nil {
			p.checker.start()
		}
		if p.scraper != nil {
			p.scraper.Start()
		}
		if p.lmcache != nil {
			p.lmcache.poller.Start()
		}
	}
	if s.kv != nil {
		s.kv.start()
	}
	for _, r := range s.Routes {
		if lc, ok := r.Strategy.(lifecycle); ok {
			if err := lc.Start(); err != nil {
				s.stop()
				return fmt.Errorf("cannot start strategy %q of route %q: %w", r.StrategyName, r.Model, err)
			}
		}
	}
	return nil
}

// stop stops background work and closes idle upstream connections.
func (s *Snapshot) stop() {
	if s.kv != nil {
		s.kv.stop()
	}
	for _, r := range s.Routes {
		if lc, ok := r.Strategy.(lifecycle); ok {
			lc.Stop()
		}
	}
	for _, p := range s.Providers {
		if p.checker != nil {
			p.checker.stop()
		}
		if p.scraper != nil {
			p.scraper.Stop()
		}
		if p.lmcache != nil {
			p.lmcache.poller.Stop()
		}
		p.up.closeIdle(true)
	}
}

// describe returns a one-line summary of the snapshot for logs.
func (s *Snapshot) describe() string {
	var parts []string
	for _, r := range s.Routes {
		parts = append(parts, fmt.Sprintf("%s(%s, %d targets)", r.Model, r.StrategyName, len(r.Targets)))
	}
	return strings.Join(parts, " ")
}

// startScrape sets up the [metrics_scrape] poller of p: the engine's /metrics at the root of its api_base.
func (p *Provider) startScrape(cfg *Config, log *slog.Logger, set *telemetry.Set) {
	u, _ := url.Parse(p.cfg.APIBase)
	mc := cfg.MetricsScrape
	sc := telemetry.ScrapeConfig{
		BaseURL:  u.Scheme + "://" + u.Host,
		Path:     mc.Path,
		Interval: secs(mc.IntervalSecs),
		Timeout:  secs(mc.TimeoutSecs),
		Baseline: p.inflight.Load,
	}
	if p.auth != nil {
		sc.Headers = map[string]string{"Authorization": string(p.auth)}
	}
	load := &telemetry.EngineLoad{}
	p.scraper = telemetry.NewScraper(sc, load, log.With("target", p.Name))
	// A scrape older than three intervals is stale: it contributes nothing rather than an old number.
	maxAge := int64(3 * sc.Interval)
	p.engineLoad = func() int64 {
		e, _ := load.External(time.Now().UnixNano(), maxAge)
		return e
	}
	l := "target=" + telemetry.Label(p.Name)
	now := func() int64 { return time.Now().UnixNano() }
	set.Gauge(telemetry.EngineRunning, l, func() float64 {
		r, _, ok := load.Queue(now(), maxAge)
		if !ok {
			return -1
		}
		return float64(r)
	})
	set.Gauge(telemetry.EngineWaiting, l, func() float64 {
		_, w, ok := load.Queue(now(), maxAge)
		if !ok {
			return -1
		}
		return float64(w)
	})
	set.Gauge(telemetry.EngineKVUsage, l, func() float64 {
		u, ok := load.KVUsage(now(), maxAge)
		if !ok {
			return -1
		}
		return u
	})
	sp := p.scraper
	set.CounterFunc(telemetry.Scrapes, l+`,result="ok"`, func() uint64 { return sp.Stats().OK })
	set.CounterFunc(telemetry.Scrapes, l+`,result="failed"`, func() uint64 { return sp.Stats().Failed })
}
