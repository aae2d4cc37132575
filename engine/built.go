package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/rolter-ai/rolter/config"
)

// Built describes, as stable text, what every runtime component of the gateway was actually built from:
// the listener's settings, each provider's config, sections, upstream, health checker, scraper and LMCache
// poller, each KV-event source as the subscriber holds it, each route's strategy with its effective
// parameters, tries' ceilings and shadows, the data-plane keys, the routing trace and the observers.
// Counters, learned routing memory and anything random are left out, so a gateway reloaded onto a config
// and one started on it describe the same (the reload tests compare them). Secrets - API keys, header
// values, CURVE secret keys, the key pepper - appear as a short digest only.
func (g *Gateway) Built() string {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	s := g.snap.Load()
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("listener: read=%s write=%s idle=%s read_buffer=%d %s",
		g.server.ReadTimeout, g.server.WriteTimeout, g.server.IdleTimeout, g.server.ReadBufferSize,
		g.clients.Describe())
	w("config: %s", liveSections(s.cfg))
	for _, p := range s.Providers {
		describeProvider(w, p)
	}
	for _, name := range slices.Sorted(maps.Keys(s.kv)) {
		g.describeKV(w, name, s.kv[name])
	}
	for _, r := range s.Routes {
		describeRoute(w, s, r)
	}
	w("pepper: %s", digest(string(s.pepper[:])))
	var keys []string
	for h, k := range s.keys {
		keys = append(keys, k.org+":"+k.id+":"+hex.EncodeToString(h[:8])+":"+k.lim.describe())
	}
	slices.Sort(keys)
	w("keys: %s", strings.Join(keys, " "))
	w("org models: %s", strings.Join(slices.Sorted(maps.Keys(s.orgModels)), " "))
	var orgLimits []string
	for org, l := range s.orgLimits {
		orgLimits = append(orgLimits, org+":"+l.describe())
	}
	slices.Sort(orgLimits)
	w("org limits: %s; default max_tokens %d", strings.Join(orgLimits, " "), s.defaultMaxTokens)
	if c := g.capture.Load(); c != nil {
		salt := "random"
		if c.cfg.SaltEnv != "" {
			salt = digest(fmt.Sprint(c.salt))
		}
		w("trace: %+v salt=%s queue=%d", c.cfg, salt, cap(c.queue))
	} else {
		w("trace: off")
	}
	if o := g.obs.Load(); o != nil {
		tc := o.traceCfg
		tc.Headers = digestValues(tc.Headers)
		w("observers: log=%+v logging=%t tracing=%+v tracer=%t egress=%+v", o.logCfg, o.log != nil, tc, o.tracer != nil, o.egress)
	}
	return b.String()
}

// liveSections renders the config's sections, which requests read from the live snapshot, without the
// providers and routes (described by what was built from them) and with secrets digested.
func liveSections(cfg *config.Config) string {
	c := *cfg
	c.Providers, c.Routes = nil, nil
	c.Tracing.Headers = digestValues(c.Tracing.Headers)
	j, err := json.Marshal(&c)
	if err != nil {
		return "cannot render: " + err.Error()
	}
	return string(j)
}

func describeProvider(w func(string, ...any), p *Provider) {
	pc := p.cfg
	pc.Headers = digestValues(pc.Headers)
	j, _ := json.Marshal(&pc)
	w("provider %q org=%q: %s", p.Name, p.cfg.Org, j)
	sec := p.sections
	sec.APIKey = digest(sec.APIKey)
	w("  sections: %+v", sec)
	var hs []string
	for _, h := range p.headers {
		hs = append(hs, h[0]+"="+digest(h[1]))
	}
	w("  auth=%s headers=[%s] names=%v xff=%t", digest(string(p.auth)), strings.Join(hs, " "), p.headerNames, p.setsXFF)
	u := p.up
	tls := "-"
	if u.tlsConfig != nil {
		tls = u.tlsConfig.ServerName
	}
	w("  upstream: addr=%s host=%s base=%s tls=%s connect=%s headers=%s idle=%s idle_age=%s max_conns=%d",
		u.addr, u.hostHeader, u.basePath, tls, u.dialTimeout, u.headersWait, u.idleGap, u.maxIdleAge, u.maxConns)
	w("  admission: max=%d max_waiting=%d wait=%s", p.adm.max, p.adm.maxWait, p.adm.wait)
	w("  health: cooldown=%+v breaker=%+v ejection=%v", p.health.cd, p.health.br, p.health.fleet.Load().maxPercent)
	if hc := p.checker; hc != nil {
		w("  checker: %+v url=%s timeout=%s", hc.cfg, hc.url, hc.client.ReadTimeout)
	} else {
		w("  checker: off")
	}
	if p.scraper != nil {
		sc := p.scrapeCfg
		w("  scraper: base=%s path=%s model=%s interval=%s timeout=%s headers=%v", sc.BaseURL, sc.Path, sc.ModelName,
			sc.Interval, sc.Timeout, digestValues(sc.Headers))
	} else {
		w("  scraper: off")
	}
	if l := p.lmcache; l != nil {
		w("  lmcache: url=%s refresh=%s timeout=%s max_age=%d headers=%v", l.cfg.URL, l.cfg.Refresh, l.cfg.Timeout, l.maxAge,
			digestValues(l.cfg.Headers))
	} else {
		w("  lmcache: off")
	}
}

// describeKV renders a KV-event source: its config, and the subscription the subscriber runs for it.
func (g *Gateway) describeKV(w func(string, ...any), name string, src *kvSource) {
	j, _ := json.Marshal(&src.cfg)
	w("kv %q: %s", name, j)
	sc, ok := g.kv.sub.Config(src.id)
	sc.CurveSecretKey = digest(sc.CurveSecretKey)
	w("  subscribed=%t %+v current=%t", ok, sc, g.kv.current[name] == src)
}

func describeRoute(w func(string, ...any), s *Snapshot, r *Route) {
	w("route %q: strategy=%s org=%q keyed=%t stale=%v/%d header=%s", r.Model, r.StrategyName, r.org, r.keyed,
		r.staleGap, r.staleWindow, r.strategyHeader)
	for _, t := range r.Targets {
		w("  target %d: provider=%s live=%t model=%s json=%s weight=%v peer=%x", t.Index, t.Provider.Name,
			s.providers[t.Provider.Name] == t.Provider, t.Model, t.modelJSON, t.Weight, t.peerID)
	}
	w("  %s", describeStrategy(s, r, r.Strategy))
	if lr := r.lora; lr != nil {
		w("  lora: adapter=%s base=%s id=%x order=%v k=%d..%d per=%d slots=%d cool=%s dynamic=%t path=%q timeout=%s",
			lr.adapter, lr.base, lr.id, lr.order, lr.kMin, lr.kMax, lr.per, lr.slots, time.Duration(lr.cool), lr.dynamic, lr.path, lr.timeout)
	}
	if pd := r.pd; pd != nil {
		w("  disaggregation: sglang=%t threshold_bytes=%d bootstrap_port=%d", pd.sglang, pd.thresholdBytes, pd.bootstrapPort)
		for _, t := range pd.decode {
			w("  decode %d: provider=%s live=%t model=%s json=%s weight=%v", t.Index, t.Provider.Name,
				s.providers[t.Provider.Name] == t.Provider, t.Model, t.modelJSON, t.Weight)
		}
	}
	if r.shadows == nil {
		return
	}
	for _, sh := range r.shadows.shadows {
		w("  shadow %s: %s", sh.name, describeStrategy(s, sh.route, sh.strategy))
		for _, t := range sh.route.Targets {
			live := s.providers[t.Provider.Name]
			w("    target %d: provider=%s model=%s weight=%v cfg_live=%t lmcache_live=%t", t.Index, t.Provider.Name, t.Model,
				t.Weight, live != nil && reflect.DeepEqual(live.cfg, t.Provider.cfg), live != nil && live.lmcache == t.Provider.lmcache)
		}
	}
}

// describeStrategy renders a strategy's effective parameters and its tries' ceilings.
func describeStrategy(s *Snapshot, r *Route, st Strategy) string {
	var d string
	switch x := st.(type) {
	case *cacheAware:
		d = fmt.Sprintf("cache_aware threshold=%v home=%t margin=%v factor=%v", x.threshold, x.home, x.margin, x.factor)
	case *pipeline:
		hot := 0
		if x.hot != nil {
			hot = len(x.hot.slots)
		}
		d = fmt.Sprintf("pipeline weight=%v load=%v cache=%v weights=%v session_ttl=%d max_sessions=%d hot=%d",
			x.weightF, x.loadF, x.cacheF, x.weights, x.sessions.ttl, x.sessions.max, hot)
	case *preciseCacheAware:
		var srcs []string
		for i, t := range r.Targets {
			src := s.kv[t.Provider.Name]
			srcs = append(srcs, fmt.Sprintf("%s:%t", t.Provider.Name, src != nil && src.id == x.ids[i] && src.st == x.streams[i]))
		}
		d = fmt.Sprintf("precise_cache_aware threshold=%v home=%t sources=%v", x.threshold, x.home, srcs)
	case *consistentHash:
		d = fmt.Sprintf("consistent_hash key_bytes=%d ring=%d/%s", x.keyBytes, len(x.ring),
			digest(fmt.Sprint(x.ring, x.owner)))
	case *weighted:
		d = fmt.Sprintf("weighted seq=%v", x.seq)
	default:
		d = fmt.Sprintf("%T", st)
	}
	if r.bound != nil {
		d += fmt.Sprintf(" load_bound=%v weights=%v", r.bound.epsilon, r.bound.weights)
	}
	if h, ok := st.(trieHolder); ok {
		var caps []string
		for _, tr := range h.triesOf() {
			n, b := tr.Limits()
			caps = append(caps, fmt.Sprintf("%d/%d", n, b))
		}
		d += " tries=" + strings.Join(caps, ",")
	}
	return d
}

// digest names a secret without showing it: "-" for none, else the first bytes of its SHA-256.
func digest(secret string) string {
	if secret == "" {
		return "-"
	}
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:6])
}

// digestValues returns m with every value digested.
func digestValues(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	d := make(map[string]string, len(m))
	for k, v := range m {
		d[k] = digest(v)
	}
	return d
}
