package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/rolter-ai/rolter/egress"
	"github.com/rolter-ai/rolter/promptkey"
)

// validator collects the problems of one config. Each section has its method, which reports every problem
// of that section under its key path; none of them changes the config.
type validator struct {
	file   string
	lines  keyLines
	errs   Errors
	policy *egress.Policy // [egress], once checked: every endpoint the gateway dials is checked against it
	// self are the gateway's own listeners ([server] listen, [control] listen when enabled): no endpoint the
	// gateway dials may be one of them. kvBindPorts is [egress] kv_bind_ports.
	self        []selfListener
	kvBindPorts []int
	// srcs are [[sources]] and bySource the index of each source name.
	srcs     []SourceConfig
	bySource map[string]int
}

// addf records a problem with the value at key (an indexed path such as "routes[1].targets[0].provider").
func (v *validator) addf(key, format string, args ...any) {
	v.errs = append(v.errs, &Error{File: v.file, Line: v.lines.lineOf(key), Key: key, Msg: fmt.Sprintf(format, args...)})
}

// validate checks cfg, whose defaults are set (SetDefaults).
func (v *validator) validate(cfg *Config) {
	v.server(&cfg.Server)
	v.policy = v.egress(&cfg.Egress)
	v.self = ownListeners(cfg)
	v.kvBindPorts = cfg.Egress.KVBindPorts
	providers := v.providers(cfg.Providers, cfg.Control.ProviderEnv)
	v.srcs, v.bySource = cfg.Sources, v.sources(cfg.Sources, cfg.Providers, cfg.Control.ProviderEnv)
	v.routes(cfg.Routes, cfg.Providers, providers)
	v.routingMemory(cfg)
	v.metricsScrape(&cfg.MetricsScrape)
	v.health(&cfg.Health)
	v.cooldown(&cfg.Cooldown)
	v.breaker(&cfg.Breaker)
	v.retry(&cfg.Retry)
	v.timeouts(&cfg.Timeouts)
	v.queue(&cfg.Queue)
	v.control(&cfg.Control)
	v.cluster(&cfg.Cluster)
	v.trace(&cfg.Trace)
	v.observers(&cfg.Log, &cfg.Tracing)
	v.limits(cfg)
	if b := cfg.Docs.BaseURL; b != "" {
		if err := checkDocsBase(b); err != nil {
			v.addf("docs.base_url", "%s", err)
		}
	}
}

// routingMemory checks that the explicit trie ceilings of the routes, every target counted, fit
// server.routing_memory_bytes all together and [control.quotas] routing_memory_bytes per org: a route's
// own ceilings are taken as they are (trieShare gives the other routes what is left), so without this
// check one route could reserve any amount. The routes are summed in order - the file's first, then the
// orgs' - and the route that goes over is the one refused.
func (v *validator) routingMemory(cfg *Config) {
	budget, quota := cfg.Server.RoutingMemoryBytes, cfg.Control.Quotas.RoutingMemoryBytes
	total := 0
	byOrg := map[string]int{}
	for i := range cfg.Routes {
		rc := &cfg.Routes[i]
		cost := rc.TrieCost()
		if cost == 0 {
			continue
		}
		key := fmt.Sprintf("routes[%d].params.max_trie_bytes", i)
		if rc.Params.MaxTrieBytes == nil {
			key = fmt.Sprintf("routes[%d].params.max_trie_nodes", i)
		}
		total += cost
		if total > budget {
			v.quotaf(key, "the trie ceilings of route %q take %d bytes of routing memory (%d targets); with the other routes' that is %d bytes, over server.routing_memory_bytes (%d)",
				rc.Model, cost, len(rc.Targets), total, budget)
			total -= cost
			continue
		}
		if rc.Org == "" {
			continue
		}
		if byOrg[rc.Org]+cost > quota {
			v.quotaf(key, "the trie ceilings of route %q take %d bytes of routing memory (%d targets); with the org's other routes that is %d bytes, over the org's quota ([control.quotas] routing_memory_bytes, %d)",
				rc.Model, cost, len(rc.Targets), byOrg[rc.Org]+cost, quota)
			total -= cost
			continue
		}
		byOrg[rc.Org] += cost
	}
}

// quotaf records a problem that is a budget being exceeded (Error.Quota).
func (v *validator) quotaf(key, format string, args ...any) {
	v.addf(key, format, args...)
	v.errs[len(v.errs)-1].Quota = true
}

// server checks [server].
func (v *validator) server(s *ServerConfig) {
	if _, _, err := net.SplitHostPort(s.Listen); err != nil {
		v.addf("server.listen", "cannot parse listen address %q: want host:port", s.Listen)
	}
	v.positiveInt("server.max_body_bytes", s.MaxBodyBytes)
	v.positiveInt("server.max_header_bytes", s.MaxHeaderBytes)
	v.positiveInt("server.max_body_memory_bytes", s.MaxBodyMemoryBytes)
	if s.MaxBodyMemoryBytes > 0 && s.MaxBodyMemoryBytes < s.MaxBodyBytes {
		v.addf("server.max_body_memory_bytes", "must be >= server.max_body_bytes (%d), got %d", s.MaxBodyBytes, s.MaxBodyMemoryBytes)
	}
	v.tls("server", s.TLSCertFile, s.TLSKeyFile, "", s.TLSMinVersion)
	v.nonNegativeInt("server.max_conns", s.MaxConns)
	v.nonNegativeInt("server.max_conns_per_ip", s.MaxConnsPerIP)
	if s.RoutingMemoryBytes < 1<<20 {
		v.addf("server.routing_memory_bytes", "must be >= 1048576 (1 MiB), got %d", s.RoutingMemoryBytes)
	}
	v.nonNegative("server.read_timeout_secs", s.ReadTimeoutSecs)
	v.nonNegative("server.write_timeout_secs", s.WriteTimeoutSecs)
	v.nonNegative("server.idle_timeout_secs", s.IdleTimeoutSecs)
	v.nonNegative("server.drain_secs", s.DrainSecs)
	if len(s.CacheKeyFields) > promptkey.MaxKeyFields {
		v.addf("server.cache_key_fields", "at most %d fields, got %d", promptkey.MaxKeyFields, len(s.CacheKeyFields))
	}
	for i, f := range s.CacheKeyFields {
		key := fmt.Sprintf("server.cache_key_fields[%d]", i)
		switch {
		case f == "" || len(f) > promptkey.MaxKeyFieldLen:
			v.addf(key, "a field name must have 1 to %d bytes, got %q", promptkey.MaxKeyFieldLen, f)
		case slices.Contains(scannedFields, f):
			v.addf(key, "%q is read by the gateway itself; cannot use it as a cache key field", f)
		case slices.Index(s.CacheKeyFields, f) < i:
			v.addf(key, "%q is listed twice", f)
		}
	}
	if len(s.SessionHeaders) > maxSessionHeaders {
		v.addf("server.session_headers", "at most %d headers, got %d", maxSessionHeaders, len(s.SessionHeaders))
	}
	for i, h := range s.SessionHeaders {
		key := fmt.Sprintf("server.session_headers[%d]", i)
		switch {
		case !validHeaderName(h):
			v.addf(key, "invalid header name %q", h)
		case strings.EqualFold(h, "x-session-id"):
			v.addf(key, "x-session-id is always read first; list only other headers")
		case slices.IndexFunc(s.SessionHeaders[:i], func(o string) bool { return strings.EqualFold(o, h) }) >= 0:
			v.addf(key, "%q is listed twice", h)
		}
	}
}

// routes checks [[routes]] against the providers (byName: the index of each provider name).
func (v *validator) routes(rs []RouteConfig, ps []ProviderConfig, byName map[string]int) {
	models := make(map[string]int, len(rs))
	for i := range rs {
		r := &rs[i]
		key := fmt.Sprintf("routes[%d]", i)
		if r.Model == "" {
			v.addf(key+".model", "missing public model name")
		} else if j, dup := models[r.Model]; dup {
			v.addf(key+".model", "duplicate route for model %q (also routes[%d])", r.Model, j)
		} else {
			models[r.Model] = i
		}
		spec, known := Strategies[r.Strategy]
		if !known {
			v.addf(key+".strategy", "unknown strategy %q; want one of %s", r.Strategy, strategyNames())
		}
		if len(r.Targets) == 0 && len(r.Discovered) == 0 {
			v.addf(key+".targets", "route %q has no targets", r.Model)
		}
		if len(r.Targets) > MaxTargets {
			v.addf(key+".targets", "route %q has %d targets; at most %d are supported", r.Model, len(r.Targets), MaxTargets)
		}
		v.pool(key+".targets", i, r, r.Targets, false, ps, byName)
		if r.Disaggregation != nil {
			v.disaggregation(key, i, r, ps, byName)
		}
		if r.LoRA != nil {
			v.lora(key, r)
		}
		if !known {
			continue
		}
		v.params(key+".params", r.Strategy, spec, &r.Params)
		v.needsKVEvents(key, r.Strategy, spec, r, ps, byName)
		if r.Shadow != nil {
			v.shadow(key, r, ps, byName)
		}
	}
	v.loraNames(rs, models)
}

// pool checks the targets of one pool of route i (r): its targets, or its decode pool; key is the pool's.
func (v *validator) pool(key string, i int, r *RouteConfig, pool []TargetConfig, decode bool, ps []ProviderConfig, byName map[string]int) {
	for j := range pool {
		t := &pool[j]
		tk := fmt.Sprintf("%s[%d]", key, j)
		if t.Source != "" || t.Provider == "" && len(v.srcs) > 0 {
			v.sourceTarget(tk, i, r, pool, j, decode)
		} else if t.Provider == "" {
			v.addf(tk+".provider", "missing provider")
		} else if pi, ok := byName[t.Provider]; !ok {
			v.addf(tk+".provider", "unknown provider %q", t.Provider)
		} else if po := ps[pi].Org; po != "" && po != r.Org {
			// An org's provider serves only that org's routes (the file's providers serve anyone).
			v.addf(tk+".provider", "unknown provider %q", t.Provider)
		} else if k := slices.IndexFunc(pool[:j], func(o TargetConfig) bool { return o.Provider == t.Provider }); k >= 0 {
			// A target is named by its provider (x-rolter-target, metric labels, the state view): a route
			// reaches one engine under two upstream models (a base model and its LoRA adapter) through
			// two providers with the same api_base.
			v.addf(tk+".provider", "provider %q is already %s[%d]; to route two models of one engine, declare a second provider with the same api_base", t.Provider, key, k)
		}
		if w := *t.Weight; !(w > 0) || math.IsInf(w, 0) {
			v.addf(tk+".weight", "weight must be > 0, got %v", w)
		}
	}
}

// sourceTarget checks target j of a pool of route i (r), which names a source: a source of the file,
// named once in the pool, on a route of the file, that gives the KV events the route's strategies need
// (in the decode pool, which is chosen by load, none are needed).
func (v *validator) sourceTarget(tk string, i int, r *RouteConfig, pool []TargetConfig, j int, decode bool) {
	t := &pool[j]
	si, ok := v.bySource[t.Source]
	switch {
	case t.Provider != "":
		v.addf(tk+".source", "set provider or source, not both")
	case t.Source == "":
		v.addf(tk+".provider", "missing provider or source")
	case !ok || r.Org != "":
		// Sources are the operator's: an org's route cannot take an engine the operator's source found.
		v.addf(tk+".source", "unknown source %q", t.Source)
	case slices.IndexFunc(pool[:j], func(o TargetConfig) bool { return o.Source == t.Source }) >= 0:
		v.addf(tk+".source", "source %q is already a target of routes[%d]", t.Source, i)
	case !decode && r.NeedsKVEvents() && v.srcs[si].Provider.KVEvents == nil:
		v.addf(tk+".source", "the route's strategies need KV events: source %q needs [sources.provider.kv_events]", t.Source)
	}
}

// needsKVEvents checks that a strategy that routes on KV events has a source on every target.
func (v *validator) needsKVEvents(key, strategy string, spec StrategySpec, r *RouteConfig, ps []ProviderConfig, byName map[string]int) {
	if !spec.NeedsKVEvents {
		return
	}
	for j := range r.Targets {
		if pi, ok := byName[r.Targets[j].Provider]; ok && ps[pi].KVEvents == nil {
			v.addf(fmt.Sprintf("%s.targets[%d].provider", key, j),
				"strategy %q needs [providers.kv_events] on provider %q", strategy, r.Targets[j].Provider)
		}
	}
}

// shadow checks [routes.shadow] of the route at routeKey: known strategies, each once, not the live one, at
// most MaxShadows, and KV events on every target for a shadow that routes on them.
func (v *validator) shadow(routeKey string, r *RouteConfig, ps []ProviderConfig, byName map[string]int) {
	key := routeKey + ".shadow"
	names := r.Shadow.Strategies
	if len(names) > MaxShadows {
		v.addf(key+".strategies", "at most %d shadow strategies per route, got %d", MaxShadows, len(names))
	}
	for i, name := range names {
		sk := fmt.Sprintf("%s.strategies[%d]", key, i)
		spec, ok := Strategies[name]
		switch {
		case !ok:
			v.addf(sk, "unknown strategy %q; want one of %s", name, strategyNames())
		case name == r.Strategy:
			v.addf(sk, "%q is the route's own strategy", name)
		case slices.Index(names, name) < i:
			v.addf(sk, "%q is listed twice", name)
		default:
			v.needsKVEvents(routeKey, name, spec, r, ps, byName)
		}
	}
}

func (v *validator) params(key, strategy string, spec StrategySpec, p *RouteParams) {
	check := func(name string, set bool) bool {
		if !set {
			return false
		}
		if !slices.Contains(spec.Params, name) {
			if len(spec.Params) == 0 {
				v.addf(key+"."+name, "strategy %q takes no parameters", strategy)
			} else {
				v.addf(key+"."+name, "strategy %q does not use %q; its parameters: %s", strategy, name, strings.Join(spec.Params, ", "))
			}
			return false
		}
		return true
	}
	if check("threshold", p.Threshold != nil) && !(*p.Threshold >= 0 && *p.Threshold <= 1) {
		v.addf(key+".threshold", "must be between 0 and 1, got %v", *p.Threshold)
	}
	if check("max_trie_nodes", p.MaxTrieNodes != nil) && *p.MaxTrieNodes < 16 {
		v.addf(key+".max_trie_nodes", "must be >= 16, got %d", *p.MaxTrieNodes)
	}
	if check("max_trie_bytes", p.MaxTrieBytes != nil) && *p.MaxTrieBytes < 1024 {
		v.addf(key+".max_trie_bytes", "must be >= 1024, got %d", *p.MaxTrieBytes)
	}
	if check("session_ttl_secs", p.SessionTTLSecs != nil) && !(*p.SessionTTLSecs > 0) {
		v.addf(key+".session_ttl_secs", "must be > 0, got %v", *p.SessionTTLSecs)
	}
	if check("stale_gap", p.StaleGap != nil) && !(*p.StaleGap >= 0 && *p.StaleGap <= 1) {
		v.addf(key+".stale_gap", "must be between 0 (off) and 1, got %v", *p.StaleGap)
	}
	if check("stale_window", p.StaleWindow != nil) && *p.StaleWindow < 1 {
		v.addf(key+".stale_window", "must be >= 1, got %d", *p.StaleWindow)
	}
	check("home", p.Home != nil)
	if check("overload_margin", p.OverloadMargin != nil) && !(*p.OverloadMargin >= 0 && *p.OverloadMargin <= 1e6) {
		v.addf(key+".overload_margin", "must be between 0 and 1000000, got %v", *p.OverloadMargin)
	}
	if check("hot_window", p.HotWindow != nil) && (*p.HotWindow < 0 || *p.HotWindow > 4096) {
		v.addf(key+".hot_window", "must be between 0 (off) and 4096, got %d", *p.HotWindow)
	}
	if check("overload_factor", p.OverloadFactor != nil) && !(*p.OverloadFactor >= 1 && *p.OverloadFactor <= 1000) {
		v.addf(key+".overload_factor", "must be between 1 and 1000, got %v", *p.OverloadFactor)
	}
	if check("max_sessions", p.MaxSessions != nil) && *p.MaxSessions < 1 {
		v.addf(key+".max_sessions", "must be >= 1, got %d", *p.MaxSessions)
	}
	if check("epsilon", p.Epsilon != nil) && !(*p.Epsilon > 0 && *p.Epsilon <= 10) {
		v.addf(key+".epsilon", "must be in (0, 10], got %v", *p.Epsilon)
	}
	if check("load_bound", p.LoadBound != nil) && !(*p.LoadBound >= 0 && *p.LoadBound <= 10) {
		v.addf(key+".load_bound", "must be between 0 (off) and 10, got %v", *p.LoadBound)
	}
	if check("virtual_nodes", p.VirtualNodes != nil) && (*p.VirtualNodes < 1 || *p.VirtualNodes > 4096) {
		v.addf(key+".virtual_nodes", "must be between 1 and 4096, got %d", *p.VirtualNodes)
	}
	if check("key_bytes", p.KeyBytes != nil) && *p.KeyBytes < 1 {
		v.addf(key+".key_bytes", "must be >= 1, got %d", *p.KeyBytes)
	}
	for _, f := range []struct {
		name string
		val  *float64
	}{{"weight_factor", p.WeightFactor}, {"load_factor", p.LoadFactor}, {"cache_factor", p.CacheFactor}} {
		if check(f.name, f.val != nil) && !(*f.val >= 0 && *f.val <= 1000) {
			v.addf(key+"."+f.name, "must be between 0 and 1000, got %v", *f.val)
		}
	}
}

// metricsScrape checks [metrics_scrape]. telemetry.ScrapeConfig.Validate is not used: it checks one
// engine's scrape URL (a base URL, which the section does not have, plus the path) and takes a zero
// interval or timeout to mean its default, where here 0 is an error.
func (v *validator) metricsScrape(m *ScrapeConfig) {
	v.positive("metrics_scrape.interval_secs", m.IntervalSecs)
	v.positive("metrics_scrape.timeout_secs", m.TimeoutSecs)
	if !strings.HasPrefix(m.Path, "/") {
		v.addf("metrics_scrape.path", "path must start with '/', got %q", m.Path)
	}
}

// health checks [health].
func (v *validator) health(h *HealthConfig) {
	if !strings.HasPrefix(h.Path, "/") {
		v.addf("health.path", "path must start with '/', got %q", h.Path)
	}
	v.positive("health.interval_secs", h.IntervalSecs)
	v.positive("health.timeout_secs", h.TimeoutSecs)
	v.positiveInt("health.unhealthy_threshold", h.UnhealthyThreshold)
	v.positiveInt("health.healthy_threshold", h.HealthyThreshold)
	if !(h.MaxEjectionPercent >= 0 && h.MaxEjectionPercent <= 100) {
		v.addf("health.max_ejection_percent", "must be between 0 and 100, got %v", h.MaxEjectionPercent)
	}
}

// cooldown checks [cooldown].
func (v *validator) cooldown(c *CooldownConfig) {
	v.positiveInt("cooldown.failures", c.Failures)
	v.positive("cooldown.window_secs", c.WindowSecs)
	v.positive("cooldown.base_secs", c.BaseSecs)
	v.positive("cooldown.max_secs", c.MaxSecs)
	if c.MaxSecs < c.BaseSecs {
		v.addf("cooldown.max_secs", "max_secs (%v) must be >= base_secs (%v)", c.MaxSecs, c.BaseSecs)
	}
	v.nonNegative("cooldown.max_retry_after_secs", c.MaxRetryAfterSecs)
	v.positiveInt("cooldown.consecutive_5xx", c.Consecutive5xx)
}

// breaker checks [breaker].
func (v *validator) breaker(b *BreakerConfig) {
	v.positiveInt("breaker.failures", b.Failures)
	v.positive("breaker.open_secs", b.OpenSecs)
	v.positiveInt("breaker.half_open_probes", b.HalfOpenProbes)
}

// retry checks [retry].
func (v *validator) retry(r *RetryConfig) {
	if r.MaxRetries < 0 || r.MaxRetries > 10 {
		v.addf("retry.max_retries", "must be between 0 and 10, got %d", r.MaxRetries)
	}
	v.nonNegative("retry.backoff_ms", r.BackoffMs)
	v.nonNegative("retry.max_backoff_ms", r.MaxBackoffMs)
}

// timeouts checks [timeouts].
func (v *validator) timeouts(t *TimeoutsConfig) {
	v.positive("timeouts.connect_secs", t.ConnectSecs)
	v.positive("timeouts.headers_secs", t.HeadersSecs)
	v.positive("timeouts.idle_secs", t.IdleSecs)
}

// queue checks [queue].
func (v *validator) queue(q *QueueConfig) {
	v.nonNegativeInt("queue.max_inflight", q.MaxInflight)
	v.nonNegativeInt("queue.max_inflight_per_target", q.MaxInflightPerTarget)
	v.nonNegativeInt("queue.max_waiting_per_target", q.MaxWaitingPerTarget)
	v.nonNegative("queue.wait_timeout_secs", q.WaitTimeoutSecs)
	v.positive("queue.retry_after_secs", q.RetryAfterSecs)
}

func (v *validator) positive(key string, x float64) {
	if !(x > 0) || math.IsInf(x, 0) {
		v.addf(key, "must be > 0, got %v", x)
	}
}

func (v *validator) nonNegative(key string, x float64) {
	if !(x >= 0) || math.IsInf(x, 0) {
		v.addf(key, "must be >= 0, got %v", x)
	}
}

func (v *validator) positiveInt(key string, x int) {
	if x <= 0 {
		v.addf(key, "must be > 0, got %d", x)
	}
}

func (v *validator) nonNegativeInt(key string, x int) {
	if x < 0 {
		v.addf(key, "must be >= 0, got %d", x)
	}
}

// maxSecs is the longest time.Duration in seconds (about 292 years).
const maxSecs = float64(math.MaxInt64) / float64(time.Second)

// validSecs reports whether s seconds convert to a time.Duration (secs) without overflow.
func validSecs(s float64) bool {
	return math.Abs(s) < maxSecs
}

// unjoin returns the errors joined in err (errors.Join), err alone if it joins none, or nothing for nil.
func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// checkDocsBase checks [docs] base_url: an http(s) URL, or a clean path on the control plane's origin
// ("/docs", "/manual/v2"), never "//host" (a URL of another host without a scheme).
func checkDocsBase(s string) error {
	if !strings.HasPrefix(s, "/") {
		return checkHTTPURL(s)
	}
	if strings.HasPrefix(s, "//") || strings.ContainsAny(s, "?#\\ ") || path.Clean(s) != strings.TrimSuffix(s, "/") && s != "/" {
		return fmt.Errorf("path %q must be a clean path starting with one \"/\", without a query or fragment", s)
	}
	return nil
}

func checkHTTPURL(s string) error {
	if s == "" {
		return errors.New("missing URL")
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("cannot parse URL %q: %w", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("URL %q must start with http:// or https://", s)
	}
	if u.Host == "" || u.Hostname() == "" {
		return fmt.Errorf("URL %q has no host", s)
	}
	if p := u.Port(); p != "" {
		if _, err := net.LookupPort("tcp", p); err != nil {
			return fmt.Errorf("URL %q has a bad port", s)
		}
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("URL %q must not carry a query, fragment or user info", s)
	}
	return nil
}
