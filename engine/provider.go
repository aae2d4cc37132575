package engine

import (
	"context"
	"log/slog"
	"net"
	"net/url"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/egress"
	"github.com/rolter-ai/rolter/telemetry"
)

// Provider is the state shared by every target that points at one upstream engine: its connection pool,
// its in-flight counter (the load every strategy reads), its health, and its background sources (health
// checker, /metrics scraper, LMCache poller). The mutable state is flat, padded atomics, read on every
// routing decision (docs/architecture.md, "Concurrency rules").
//
// A Provider outlives the snapshot that built it as long as its identity holds: a reload whose config gives
// a provider of the same name the same settings (sameAs) keeps this very object - pool, in-flight count,
// cooldowns and breaker, pollers and metric series. Published snapshots hold it (holds); the last one to
// retire stops it (docs/architecture.md, "Reload").
type Provider struct {
	Name      string
	nameBytes []byte
	// cfg is the provider's config without its kv_events: the KV-event source lives apart (kvSource) and a
	// provider is kept across reloads that change only that source, so a copy here would go stale.
	cfg      config.ProviderConfig
	sections providerSections // the global config sections that shaped it
	up       *upstream
	// auth is the Authorization header value sent upstream ("Bearer <key>"), or nil to pass the client's.
	auth []byte
	// headers are the configured extra headers, sorted by name; they replace client headers of the same name.
	headers [][2]string
	// headerNames are the names of headers, lower-cased.
	headerNames []string
	setsXFF     bool // headers include X-Forwarded-For

	// inflight counts this gateway's requests in flight to the engine (the admission slot counter). It is
	// padded, and shared with the provider this one replaced when both name the same engine (name and
	// api_base), so the requests of a draining snapshot still count as that engine's load.
	inflight *atomic.Int64
	// picked counts the requests ranked first here and not yet admitted anywhere (call.pickTarget); on
	// inflight's cache line and shared like it.
	picked *atomic.Int64
	// cache numbers the engine's prefix-cache contents (lifecycle.go); shared like inflight.
	cache *cacheEpoch

	// engineLoad, when set, returns the engine's requests (running + waiting, from its /metrics) that are not
	// this gateway's own, or 0 when that number is unknown or stale.
	engineLoad func() int64
	// peerLoad is the other gateway replicas' in-flight count on the engine (SetPeerLoads, from the
	// cluster), 0 without one.
	peerLoad atomic.Int64
	// engineQueue, when set, returns the engine's running and waiting requests from a fresh scrape.
	engineQueue func() (running, waiting int64, ok bool)
	scraper     *telemetry.Scraper
	scrapeCfg   telemetry.ScrapeConfig // what scraper was made with (Built)

	health  *providerHealth
	adm     *admission
	checker *healthChecker
	lmcache *lmcacheSource // nil unless [providers.lmcache] is set
	// adapters is the engine's LoRA adapters, nil unless a [routes.lora] route uses the provider and
	// [metrics_scrape] is on; admin is the client of its administration API (dynamic_lora's loads).
	adapters *residency
	admin    *fasthttp.HostClient
	// loraSlots is the adapters this gateway sent the engine most recently (lora_slots.go); shared like
	// inflight.
	loraSlots *slotLRU

	// set holds the provider's own metric series; registered while a published snapshot holds it.
	set *telemetry.Set
	// holds counts the published snapshots that hold the provider; registered says whether set is
	// registered. Both are changed under Gateway.reloadMu only.
	holds      int
	registered bool
}

// providerSections are the parts of the config outside [[providers]] that shape a Provider.
type providerSections struct {
	Timeouts      config.TimeoutsConfig
	Queue         config.QueueConfig
	Health        config.HealthConfig
	Cooldown      config.CooldownConfig
	Breaker       config.BreakerConfig
	MetricsScrape config.ScrapeConfig
	Egress        egress.Config
	APIKey        string // the value of api_key_secret or api_key_env, read when the config was loaded
	// Adapters says a [routes.lora] route uses the provider: its engine's adapters are polled.
	Adapters bool
}

func sectionsOf(pc *config.ProviderConfig, cfg *config.Config) providerSections {
	s := providerSections{
		Timeouts: cfg.Timeouts, Queue: cfg.Queue, Health: cfg.Health, Cooldown: cfg.Cooldown,
		Breaker: cfg.Breaker, MetricsScrape: cfg.MetricsScrape, Egress: cfg.Egress,
	}
	// max_ejection_percent is applied to every provider by the snapshot (fleetHealth), not per provider.
	s.Health.MaxEjectionPercent = 0
	s.APIKey, _ = pc.APIKey(cfg.Control.ProviderEnv)
	s.Adapters = servesAdapters(pc.Name, cfg)
	return s
}

// sameAs reports whether a provider built from pc and cfg would be identical to p, so p can be kept. The
// KV-event source is not part of it: it lives apart (kvSource), built from the new config at every reload.
func (p *Provider) sameAs(pc *config.ProviderConfig, cfg *config.Config) bool {
	return reflect.DeepEqual(p.cfg, providerOwn(pc)) && reflect.DeepEqual(p.sections, sectionsOf(pc, cfg))
}

// providerOwn returns the part of pc a Provider is built from: all of it but kv_events.
func providerOwn(pc *config.ProviderConfig) config.ProviderConfig {
	c := *pc
	c.KVEvents = nil
	return c
}

// paddedCounter keeps a hot counter on a cache line of its own.
type paddedCounter struct {
	_      [64]byte
	n      atomic.Int64
	picked atomic.Int64
	_      [48]byte
}

// newProvider builds the provider of pc. prev, when not nil, is the provider of the same name it replaces;
// its in-flight counter is taken over when both name the same engine.
func newProvider(pc *config.ProviderConfig, cfg *config.Config, env *buildEnv, prev *Provider) (*Provider, error) {
	up, err := newUpstream(pc.Name, pc.APIBase, pc.MaxConns, cfg.Timeouts)
	if err != nil {
		return nil, err
	}
	// Upstream connections go through the egress policy, checked at connect time (tests dial in memory).
	up.dial = env.dial
	if up.dial == nil {
		up.dial = env.egress[useProxy].Dial
	}
	up.budget = env.budget
	p := &Provider{
		Name: pc.Name, nameBytes: []byte(pc.Name), cfg: providerOwn(pc), sections: sectionsOf(pc, cfg), up: up,
		adm: newAdmission(cfg.Queue), set: telemetry.NewSet(),
	}
	if prev != nil && prev.cfg.APIBase == pc.APIBase {
		p.inflight, p.picked, p.cache, p.loraSlots = prev.inflight, prev.picked, prev.cache, prev.loraSlots
	} else {
		c := new(paddedCounter)
		p.inflight, p.picked, p.cache, p.loraSlots = &c.n, &c.picked, newCacheEpoch(), &slotLRU{}
	}
	log := env.log
	p.health = newProviderHealth(pc.Name, cfg, log, p.set)
	p.health.onRecover = func() { p.cache.reset(resetRecovered) }
	if cfg.Health.Enabled {
		// The provider's own copy of [health] (sections), which a kept provider keeps matching.
		p.checker = newHealthChecker(p, p.sections.Health, p.set, env)
	}
	if _, ok := pc.APIKey(cfg.Control.ProviderEnv); ok {
		p.auth = []byte("Bearer " + wireValue(p.sections.APIKey))
	}
	if cfg.MetricsScrape.Enabled {
		p.newScraper(cfg, log, env.egress[useScrape])
	}
	p.admin = newAdminClient(p, env)
	if pc.LMCache != nil {
		p.lmcache = newLMCacheSource(p, log, p.set, env.egress[useLMCache])
	}
	for k, v := range pc.Headers {
		p.headers = append(p.headers, [2]string{k, wireValue(v)})
	}
	for k, name := range pc.HeaderSecrets {
		p.headers = append(p.headers, [2]string{k, pc.Secrets[name]})
	}
	sort.Slice(p.headers, func(a, b int) bool { return p.headers[a][0] < p.headers[b][0] })
	for _, h := range p.headers {
		p.headerNames = append(p.headerNames, strings.ToLower(h[0]))
	}
	p.setsXFF = p.setsHeader([]byte("X-Forwarded-For"))
	l := "target=" + telemetry.Label(p.Name)
	p.set.Gauge(telemetry.InflightGauge, l, func() float64 { return float64(p.inflight.Load()) })
	for _, why := range []resetReason{resetEngineRestart, resetRecovered} {
		p.set.CounterFunc(telemetry.EngineCacheResets, l+",reason="+telemetry.Label(telemetry.TrieResetReasons[why]), p.cache.resets[why].Load)
	}
	p.set.Gauge(telemetry.UpstreamConns, l, func() float64 { return float64(up.open.Load()) })
	p.set.Gauge(telemetry.QueueWaiting, l, func() float64 { return float64(p.adm.waiting.Load()) })
	return p, nil
}

// start starts the provider's background sources.
func (p *Provider) start() {
	if p.checker != nil {
		p.checker.start()
	}
	if p.scraper != nil {
		p.scraper.Start()
	}
	if p.lmcache != nil {
		p.lmcache.poller.Start()
	}
	if p.adapters != nil {
		p.adapters.models.Start()
	}
}

// stop stops the background sources and closes the idle upstream connections; connections still in use
// are closed when they come back.
func (p *Provider) stop() {
	if p.checker != nil {
		p.checker.stop()
	}
	if p.scraper != nil {
		p.scraper.Stop()
	}
	if p.lmcache != nil {
		p.lmcache.poller.Stop()
	}
	if p.adapters != nil {
		p.adapters.models.Stop()
	}
	p.admin.CloseIdleConnections()
	p.up.closeIdle(true)
}

// Load is the number of requests in flight from this gateway to the provider, plus - with [metrics_scrape]
// on and fresh - the engine's queue beyond them: its running + waiting requests minus this gateway's
// in-flight count when that scrape was read, i.e. other clients' load (docs/architecture.md, "Load"). Our
// own requests are counted once, by the fresh in-flight counter (updated at dispatch, not every scrape
// interval: routers whose load counters lagged sent every request to one worker, smg-project/smg#1714),
// so a stale scrape never makes a replica look busier than our own traffic made it.
func (p *Provider) Load() int64 {
	// Other clients: what the scrape saw, or the peer replicas' own count when that is larger (the scrape
	// counts the peers' requests too, but lags them by up to its interval).
	other := p.peerLoad.Load()
	if p.engineLoad != nil {
		other = max(other, p.engineLoad())
	}
	return p.inflight.Load() + p.picked.Load() + other
}

// Inflight returns the gateway's own in-flight count for the provider.
func (p *Provider) Inflight() int64 { return p.inflight.Load() }

// wireValue returns s with every control character but HTAB replaced by a space. The validator refuses
// such header values; this holds for a config that was not validated, or a variable's value, so that no
// configured value can end its header line and start another header or request on the wire.
func wireValue(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c < ' ' && c != '\t' || c == 0x7f {
			b[i] = ' '
		}
	}
	return string(b)
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

// newScraper sets up the [metrics_scrape] poller of p: the engine's /metrics at the root of its api_base.
func (p *Provider) newScraper(cfg *config.Config, log *slog.Logger, dialer *egress.Dialer) {
	u, _ := url.Parse(p.cfg.APIBase)
	mc := cfg.MetricsScrape
	sc := telemetry.ScrapeConfig{
		BaseURL:  u.Scheme + "://" + u.Host,
		Path:     mc.Path,
		Interval: secs(mc.IntervalSecs),
		Timeout:  secs(mc.TimeoutSecs),
		Baseline: p.inflight.Load,
		Dial:     dialer.DialContext,
		OnRestart: func() {
			p.cache.reset(resetEngineRestart)
			log.Warn("engine restarted: its prefix cache is empty, its tries start over", "target", p.Name)
		},
	}
	if p.auth != nil {
		sc.Headers = map[string]string{"Authorization": string(p.auth)}
	}
	if p.sections.Adapters {
		sc.Adapters = p.newResidency(sc, log, dialer)
	}
	load := &telemetry.EngineLoad{}
	p.scraper, p.scrapeCfg = telemetry.NewScraper(sc, load, log.With("target", p.Name)), sc
	// A scrape older than three intervals is stale: it contributes nothing rather than an old number.
	maxAge := int64(3 * sc.Interval)
	p.engineLoad = func() int64 {
		e, _ := load.External(time.Now().UnixNano(), maxAge)
		return e
	}
	p.engineQueue = func() (int64, int64, bool) {
		r, w, ok := load.Queue(time.Now().UnixNano(), maxAge)
		return int64(r), int64(w), ok
	}
	set := p.set
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

// dialFunc replaces TCP dialing of upstreams (in-memory listeners in tests and benchmarks).
type dialFunc func(addr string, timeout time.Duration) (net.Conn, error)

// lmcacheSource is a provider's LMCache-style status endpoint ({"occupancy": 0..1, "cache_available": bool}),
// polled every refresh_secs; a status older than stale_secs, or a failed poll, is not used.
type lmcacheSource struct {
	status telemetry.CacheStatus
	poller *telemetry.LMCachePoller
	cfg    telemetry.LMCacheConfig // what poller was made with (Built)
	maxAge int64
}

func newLMCacheSource(p *Provider, log *slog.Logger, set *telemetry.Set, dialer *egress.Dialer) *lmcacheSource {
	c := p.cfg.LMCache
	src := &lmcacheSource{maxAge: int64(secs(c.StaleSecs))}
	lc := telemetry.LMCacheConfig{URL: c.Endpoint, Refresh: secs(c.RefreshSecs), Timeout: min(secs(c.RefreshSecs), 2*time.Second),
		Dial: dialer.DialContext}
	src.poller, src.cfg = telemetry.NewLMCachePoller(lc, &src.status, log.With("target", p.Name, "component", "lmcache")), lc
	l := "target=" + telemetry.Label(p.Name)
	pl := src.poller
	set.CounterFunc(telemetry.LMCachePolls, l+`,result="ok"`, func() uint64 { return pl.Stats().OK })
	set.CounterFunc(telemetry.LMCachePolls, l+`,result="failed"`, func() uint64 { return pl.Stats().Failed })
	return src
}

// get returns the fresh status, if any.
func (s *lmcacheSource) get(now int64) (occupancy float64, available, ok bool) {
	if s == nil {
		return 0, false, false
	}
	return s.status.Get(now, s.maxAge)
}

// healthChecker probes one provider; at most one probe is in flight (the loop is sequential).
type healthChecker struct {
	h      *providerHealth
	cfg    config.HealthConfig
	client *fasthttp.HostClient
	url    string
	ok     *metrics.Counter
	failed *metrics.Counter
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newHealthChecker(p *Provider, cfg config.HealthConfig, set *telemetry.Set, env *buildEnv) *healthChecker {
	u, _ := url.Parse(p.cfg.APIBase)
	hc := &healthChecker{
		h:   p.health,
		cfg: cfg,
		url: u.Scheme + "://" + u.Host + cfg.Path,
		client: &fasthttp.HostClient{
			Addr:                          p.up.addr,
			IsTLS:                         u.Scheme == "https",
			ReadTimeout:                   secs(cfg.TimeoutSecs),
			WriteTimeout:                  secs(cfg.TimeoutSecs),
			MaxConns:                      1,
			NoDefaultUserAgentHeader:      true,
			DisablePathNormalizing:        true,
			MaxIdleConnDuration:           p.up.maxIdleAge,
			MaxIdemponentCallAttempts:     1,
			DisableHeaderNamesNormalizing: false,
		},
	}
	hc.client.DialTimeout = (fasthttp.DialFuncWithTimeout)(env.dial)
	if env.dial == nil {
		hc.client.DialTimeout = env.egress[useHealth].Dial
	}
	l := "target=" + telemetry.Label(p.Name)
	hc.ok = set.Counter(telemetry.HealthChecks, l+`,result="ok"`)
	hc.failed = set.Counter(telemetry.HealthChecks, l+`,result="failed"`)
	return hc
}

func (hc *healthChecker) start() {
	ctx, cancel := context.WithCancel(context.Background())
	hc.cancel = cancel
	hc.wg.Add(1)
	go hc.run(ctx)
}

func (hc *healthChecker) stop() {
	if hc.cancel == nil {
		return // never started: its snapshot was not published
	}
	hc.cancel()
	hc.wg.Wait()
	hc.client.CloseIdleConnections()
}

func (hc *healthChecker) run(ctx context.Context) {
	defer hc.wg.Done()
	defer logPanic(hc.h.log, "health checker "+hc.h.name)
	interval := secs(hc.cfg.IntervalSecs)
	timeout := secs(hc.cfg.TimeoutSecs)
	fails, oks := 0, 0
	t := time.NewTimer(0)
	defer t.Stop()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		req.Reset()
		req.SetRequestURI(hc.url)
		req.Header.SetMethod(fasthttp.MethodGet)
		err := hc.client.DoTimeout(req, resp, timeout)
		reason := ""
		switch {
		case err != nil:
			reason = "health check failed: " + err.Error()
		case resp.StatusCode() >= 300:
			reason = "health check answered HTTP " + strconv.Itoa(resp.StatusCode())
		}
		if reason == "" {
			hc.ok.Inc()
			oks++
			fails = 0
			if oks >= hc.cfg.HealthyThreshold {
				hc.h.setDown(false, strconv.Itoa(oks)+" consecutive health checks passed")
			}
		} else {
			hc.failed.Inc()
			fails++
			oks = 0
			if fails >= hc.cfg.UnhealthyThreshold {
				hc.h.setDown(true, reason)
			}
		}
		t.Reset(interval)
	}
}
