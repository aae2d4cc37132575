package telemetry

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// Every metric the gateway exports is named here, once (docs/observability/metrics.md lists the same
// names and labels). Handles are created when a config snapshot is built and kept by the route or target, so the
// request path never looks a metric up by name.
const (
	// Per route and target (target = provider name).
	mRequests        = "rolter_requests_total"              // {route,target,code}
	mRequestDuration = "rolter_request_duration_seconds"    // {route,target} histogram, until the last byte
	mTTFT            = "rolter_time_to_first_byte_seconds"  // {route,target} histogram, first upstream body byte
	mUpstreamErrors  = "rolter_upstream_errors_total"       // {route,target,kind}
	mStreamErrors    = "rolter_stream_errors_total"         // {route,target,kind} failures after the first byte
	mDecisions       = "rolter_decisions_total"             // {route,strategy,decision}
	mRetries         = "rolter_retries_total"               // {route}
	mClientGone      = "rolter_client_disconnects_total"    // {route}
	mNoTarget        = "rolter_no_eligible_target_total"    // {route,action} action = fail_open | reject
	mBadRequests     = "rolter_bad_requests_total"          // {code}
	mInflight        = "rolter_inflight_requests"           // {target} gauge
	mTrieNodes       = "rolter_trie_nodes"                  // {route,target} gauge
	mTrieBytes       = "rolter_trie_edge_bytes"             // {route,target} gauge
	mTrieArena       = "rolter_trie_arena_bytes"            // {route,target} gauge
	mTriePrompts     = "rolter_trie_prompts"                // {route,target} gauge
	mTrieEvictions   = "rolter_trie_evictions_total"        // {route,target} counter (cumulative, from the trie)
	mConfigInfo      = "rolter_config_info"                 // {route,strategy} gauge = 1
	mUpstreamConns   = "rolter_upstream_connections"        // {target} gauge
	mBuildInfo       = "rolter_build_info"                  // {version} gauge = 1
	mUptime          = "rolter_uptime_seconds"              // gauge
	mAdmission       = "rolter_admission_rejected_total"    // {route,scope} scope = global | target
	mQueueWait       = "rolter_admission_wait_seconds"      // {route} histogram
	mQueueWaiting    = "rolter_admission_waiting"           // {target} gauge
	mTargetState     = "rolter_target_state_changes_total"  // {target,state}
	mTargetEligible  = "rolter_target_eligible"             // {target} gauge 0/1
	mCooldownSecs    = "rolter_target_cooldown_seconds"     // {target} gauge, remaining
	mBreakerState    = "rolter_breaker_state"               // {target} gauge 0 closed, 1 half-open, 2 open
	mHealthChecks    = "rolter_health_checks_total"         // {target,result}
	mScrapes         = "rolter_engine_scrapes_total"        // {target,result}
	mEngineRunning   = "rolter_engine_requests_running"     // {target} gauge, from the engine's /metrics
	mEngineWaiting   = "rolter_engine_requests_waiting"     // {target} gauge
	mKVEvents        = "rolter_kv_events_total"             // {target,kind}
	mKVStream        = "rolter_kv_stream_total"             // {target,event} gaps, restarts, replays, stale, decode errors
	mKVBlocks        = "rolter_kv_index_blocks"             // {target} gauge
	mKVTrusted       = "rolter_kv_stream_trusted"           // {target} gauge 0/1
	mKVLastSeq       = "rolter_kv_stream_last_seq"          // {target} gauge
	mSessions        = "rolter_sessions"                    // {route} gauge
	mLMCachePolls    = "rolter_lmcache_polls_total"         // {target,result}
	mScrapeQueue     = "rolter_engine_kv_cache_usage_ratio" // {target} gauge
	mRequestsRetried = "rolter_requests_with_retries_total" // {route}
	mDrain           = "rolter_draining"                    // gauge 0/1
	mProcessStart    = "rolter_process_start_time_seconds"  // gauge
	mDecisionLatency = "rolter_decision_duration_seconds"   // {route} histogram: parse + key + pick
	mUpstreamHeaders = "rolter_upstream_headers_seconds"    // {route,target} histogram: send -> headers
	mBodyBytes       = "rolter_response_bytes_total"        // {route,target}

	// Routing evidence, per route and target (docs/architecture.md, "Routing evidence"). Delivered: what the
	// engines' usage reported, over 2xx responses that reported both numbers (usage="measured"); the others
	// are counted as usage="unmeasured", never as zero reuse. Predicted, over the same measured responses, in
	// the strategy's unit (key bytes for the trie strategies, tokens for precise_cache_aware): the prompt's
	// size, the best match over the eligible targets (held) and the chosen target's (captured).
	mUsageResponses = "rolter_usage_responses_total"     // {route,target,usage} measured | unmeasured
	mPromptTokens   = "rolter_prompt_tokens_total"       // {route,target}
	mCachedTokens   = "rolter_cached_tokens_total"       // {route,target}
	mReuseScored    = "rolter_reuse_scored_total"        // {route,target} prompt size in the strategy's unit
	mReuseHeld      = "rolter_reuse_held_total"          // {route,target}
	mReuseCaptured  = "rolter_reuse_captured_total"      // {route,target}
	mReuseGap       = "rolter_reuse_gap_ratio"           // {route,target} gauge: recent captured - delivered fraction
	mTrieResets     = "rolter_trie_resets_total"         // {route,target,reason} engine_restart | recovered | stale
	mCacheResets    = "rolter_engine_cache_resets_total" // {target,reason} engine_restart | recovered: the engine's cache is presumed empty

	// Shadow strategies ([routes.shadow]), per route and shadow strategy: requests ranked, requests that
	// ended with a 2xx, those whose answering target was the shadow's pick, the shadow's predicted reuse in
	// its own counterfactual state, and the load spread (coefficient of variation of in-flight requests over
	// the eligible targets, recent average) its picks would have made - shadow="live" is the live strategy's.
	mShadowRanked        = "rolter_shadow_ranked_total"         // {route,shadow}
	mShadowEnded         = "rolter_shadow_succeeded_total"      // {route,shadow}
	mShadowAgreed        = "rolter_shadow_agreed_total"         // {route,shadow}
	mShadowDropped       = "rolter_shadow_dropped_total"        // {route} requests the shadows had no room for
	mShadowReuseScored   = "rolter_shadow_reuse_scored_total"   // {route,shadow}
	mShadowReuseHeld     = "rolter_shadow_reuse_held_total"     // {route,shadow}
	mShadowReuseCaptured = "rolter_shadow_reuse_captured_total" // {route,shadow}
	mShadowLoadCoV       = "rolter_shadow_load_cov"             // {route,shadow} gauge

	// The routing trace ([trace]).
	mTraceRecords = "rolter_trace_records_total" // {result} written | dropped (queue full) | write_failed

	// Request logs and traces ([log], [tracing]).
	mAccessLogLines = "rolter_access_log_lines_total" // {result} written | dropped (queue full) | write_failed
	mTracingSpans   = "rolter_tracing_spans_total"    // {result} exported | dropped (queue full) | export_failed

	// Client connections (package clientconn).
	mClientConns    = "rolter_client_connections"                // gauge, open
	mClientParked   = "rolter_client_connections_parked"         // gauge, idle and holding no buffer
	mClientRejected = "rolter_client_connections_rejected_total" // {reason} closed by the listener
	mAcceptErrors   = "rolter_accept_errors_total"               // failed accepts, retried with backoff
	mEgressRefused  = "rolter_egress_refused_total"              // {use} connections the egress policy refused

	// Control-plane connections (engine ControlListener).
	mControlConns    = "rolter_control_connections"                // gauge, open
	mControlRejected = "rolter_control_connections_rejected_total" // closed on arrival at [control] max_conns

	// Config reloads (engine Gateway.Reload).
	mReloads        = "rolter_config_reloads_total"                         // {result} ok | failed
	mGeneration     = "rolter_config_generation"                            // gauge: 1 at start, +1 per reload
	mLastReloadTime = "rolter_config_last_reload_success_timestamp_seconds" // gauge, unix seconds
)

// init turns on # HELP and # TYPE lines for everything VictoriaMetrics writes in this process, /metrics
// included: stock Prometheus tooling (promtool, Grafana) needs them to tell counters from gauges, and the
// counters this package writes itself (Set.CounterFunc) always carry them. metrics.ExposeMetadata is a
// library-wide switch, so it is set once here, by the package that owns the process's metrics format, not
// as a side effect of creating a gateway.
func init() {
	metrics.ExposeMetadata(true)
}

// ReloadMetrics are one gateway's config reload series.
type ReloadMetrics struct {
	set        *Set
	ok, failed *metrics.Counter
	lastOK     atomic.Int64 // unix seconds
}

// NewReloadMetrics creates them; generation reports the live config generation. They are exported once
// Register is called.
func NewReloadMetrics(generation func() uint64) *ReloadMetrics {
	m := &ReloadMetrics{set: NewSet()}
	m.ok = m.set.Counter(mReloads, `result="ok"`)
	m.failed = m.set.Counter(mReloads, `result="failed"`)
	m.set.Gauge(mGeneration, "", func() float64 { return float64(generation()) })
	m.set.Gauge(mLastReloadTime, "", func() float64 { return float64(m.lastOK.Load()) })
	return m
}

// Reloaded counts a reload; at is when it succeeded (ignored when it failed).
func (m *ReloadMetrics) Reloaded(ok bool, at time.Time) {
	if ok {
		m.ok.Inc()
		m.lastOK.Store(at.Unix())
		return
	}
	m.failed.Inc()
}

// Register exports the series; Unregister removes them.
func (m *ReloadMetrics) Register()   { m.set.Register() }
func (m *ReloadMetrics) Unregister() { m.set.Unregister() }

// Label quotes a Prometheus label value.
func Label(s string) string {
	if !strings.ContainsAny(s, "\"\\\n") {
		return `"` + s + `"`
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}

// latencyBuckets are le buckets (seconds) spanning gateway overhead (100 µs) to long generations (10 min).
var latencyBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 30, 60, 120, 300, 600,
}

// Set is a group of series exported and removed together: the metrics of one config snapshot (registered
// with the global registry while the snapshot is live and unregistered when it is replaced), or a
// gateway's own (ReloadMetrics, Global: registered from New until Shutdown).
type Set struct {
	s *metrics.Set

	mu     sync.Mutex
	funcs  []seriesFunc // grouped by family when written (sorted marks them grouped)
	sorted bool
}

// seriesFunc is a series whose value another package keeps (a trie, a KV stream, a poller), read when
// /metrics is written: a counter (count) or a gauge (gauge). Counters are typed counter, which
// VictoriaMetrics' callback gauges are not and Prometheus tooling wants for *_total names; gauges are
// written here too, so registering a snapshot's thousands of them costs no name validation each.
type seriesFunc struct {
	name  string // name{labels}
	count func() uint64
	gauge func() float64
}

// NewSet returns an empty, unregistered set.
func NewSet() *Set { return &Set{s: metrics.NewSet()} }

// Register makes the set visible on /metrics.
func (s *Set) Register() { metrics.RegisterSet(s.s) }

// Unregister removes the set from /metrics. Its metrics are not unregistered one by one (VictoriaMetrics
// scans the set for each, which costs the square of a large fleet's series): the set is dropped whole.
func (s *Set) Unregister() { metrics.UnregisterSet(s.s, false) }

// Inner returns the underlying VictoriaMetrics set, for gauges owned by other packages.
func (s *Set) Inner() *metrics.Set { return s.s }

// Gauge exposes f as the gauge name{labels}.
func (s *Set) Gauge(name, labels string, f func() float64) {
	s.add(seriesFunc{name: series(name, labels), gauge: f})
}

// series names one series: name{labels}, or name alone without labels.
func series(name, labels string) string {
	if labels == "" {
		return name
	}
	return name + "{" + labels + "}"
}

// CounterFunc exposes f as the counter name{labels}.
func (s *Set) CounterFunc(name, labels string, f func() uint64) {
	s.add(seriesFunc{name: name + "{" + labels + "}", count: f})
}

func (s *Set) add(f seriesFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.funcs == nil {
		s.s.RegisterMetricsWriter(s.writeFuncs)
	}
	s.funcs = append(s.funcs, f)
	s.sorted = false
}

func (s *Set) writeFuncs(w io.Writer) {
	s.mu.Lock()
	if !s.sorted {
		// Sorted once, at the first write after a change: a snapshot registers series per target, and
		// sorting at every one of them would cost the square of the fleet.
		sort.SliceStable(s.funcs, func(a, b int) bool { return family(s.funcs[a].name) < family(s.funcs[b].name) })
		s.sorted = true
	}
	fs := s.funcs
	s.mu.Unlock()
	last := ""
	var b []byte
	for _, f := range fs {
		if fam := family(f.name); fam != last {
			typ := "counter"
			if f.gauge != nil {
				typ = "gauge"
			}
			fmt.Fprintf(w, "# HELP %s\n# TYPE %s %s\n", fam, fam, typ)
			last = fam
		}
		b = append(append(b[:0], f.name...), ' ')
		if f.gauge != nil {
			b = strconv.AppendFloat(b, f.gauge(), 'g', -1, 64)
		} else {
			b = strconv.AppendUint(b, f.count(), 10)
		}
		_, _ = w.Write(append(b, '\n'))
	}
}

func family(name string) string {
	if i := strings.IndexByte(name, '{'); i >= 0 {
		return name[:i]
	}
	return name
}

// Counter creates a counter name{labels}.
func (s *Set) Counter(name, labels string) *metrics.Counter {
	return s.s.GetOrCreateCounter(series(name, labels))
}

// lazyCounters creates counters of one family on first use and then serves them without locks:
// a label value set (code, decision, kind) is a small dense index, so unused series are never exported.
type lazyCounters struct {
	set    *metrics.Set
	prefix string // name{fixed labels,
	label  string // the variable label's name
	names  []string
	slots  []atomic.Pointer[metrics.Counter]
}

func newLazyCounters(set *metrics.Set, name, fixed, label string, names []string) *lazyCounters {
	prefix := name + "{"
	if fixed != "" {
		prefix += fixed + ","
	}
	return &lazyCounters{set: set, prefix: prefix, label: label, names: names, slots: make([]atomic.Pointer[metrics.Counter], len(names))}
}

// Values returns the counters used so far, by name.
func (c *lazyCounters) Values() map[string]uint64 {
	out := map[string]uint64{}
	for i := range c.slots {
		if ctr := c.slots[i].Load(); ctr != nil {
			out[c.names[i]] = ctr.Get()
		}
	}
	return out
}

// Inc increments the counter for names[i].
func (c *lazyCounters) Inc(i int) {
	if i < 0 || i >= len(c.slots) {
		return
	}
	ctr := c.slots[i].Load()
	if ctr == nil {
		ctr = c.set.GetOrCreateCounter(c.prefix + c.label + "=" + Label(c.names[i]) + "}")
		c.slots[i].Store(ctr)
	}
	ctr.Inc()
}

// statusCodes are the HTTP statuses counted individually; others fall into "other".
var statusCodes = []int{200, 201, 204, 400, 401, 403, 404, 405, 408, 409, 413, 415, 422, 429, 431, 499, 500, 501, 502, 503, 504}

var statusNames = func() []string {
	names := make([]string, 0, len(statusCodes)+1)
	for _, c := range statusCodes {
		names = append(names, strconv.Itoa(c))
	}
	return append(names, "other")
}()

func statusSlot(code int) int {
	for i, c := range statusCodes {
		if c == code {
			return i
		}
	}
	return len(statusCodes)
}

// TargetMetrics are the per (route, target) handles.
type TargetMetrics struct {
	requests       *lazyCounters
	upstreamErrors *lazyCounters
	streamErrors   *lazyCounters
	trieResets     *lazyCounters
	Duration       *metrics.PrometheusHistogram
	TTFB           *metrics.PrometheusHistogram
	Headers        *metrics.PrometheusHistogram
	ResponseBytes  *metrics.Counter

	// Routing evidence (the m* constants above say what each counts).
	Measured, Unmeasured                  *metrics.Counter
	PromptTokens, CachedTokens            *metrics.Counter
	ReuseScored, ReuseHeld, ReuseCaptured *metrics.Counter
}

// NewTargetMetrics creates the handles for one target of a route. failKinds names the upstream failure kinds.
func (s *Set) NewTargetMetrics(route, target string, failKinds []string) *TargetMetrics {
	l := "route=" + Label(route) + ",target=" + Label(target)
	return &TargetMetrics{
		trieResets:     newLazyCounters(s.s, mTrieResets, l, "reason", TrieResetReasons),
		requests:       newLazyCounters(s.s, mRequests, l, "code", statusNames),
		upstreamErrors: newLazyCounters(s.s, mUpstreamErrors, l, "kind", failKinds),
		streamErrors:   newLazyCounters(s.s, mStreamErrors, l, "kind", failKinds),
		Duration:       s.s.NewPrometheusHistogramExt(mRequestDuration+"{"+l+"}", latencyBuckets),
		TTFB:           s.s.NewPrometheusHistogramExt(mTTFT+"{"+l+"}", latencyBuckets),
		Headers:        s.s.NewPrometheusHistogramExt(mUpstreamHeaders+"{"+l+"}", latencyBuckets),
		ResponseBytes:  s.s.NewCounter(mBodyBytes + "{" + l + "}"),
		Measured:       s.s.NewCounter(mUsageResponses + "{" + l + `,usage="measured"}`),
		Unmeasured:     s.s.NewCounter(mUsageResponses + "{" + l + `,usage="unmeasured"}`),
		PromptTokens:   s.s.NewCounter(mPromptTokens + "{" + l + "}"),
		CachedTokens:   s.s.NewCounter(mCachedTokens + "{" + l + "}"),
		ReuseScored:    s.s.NewCounter(mReuseScored + "{" + l + "}"),
		ReuseHeld:      s.s.NewCounter(mReuseHeld + "{" + l + "}"),
		ReuseCaptured:  s.s.NewCounter(mReuseCaptured + "{" + l + "}"),
	}
}

// ReuseGap exports f, the recent gap between predicted and delivered reuse of one target (NaN: not
// measured yet), as a gauge.
func (s *Set) ReuseGap(route, target string, f func() float64) {
	s.s.NewGauge(mReuseGap+"{route="+Label(route)+",target="+Label(target)+"}", f)
}

// Request counts one finished request with its final status.
func (m *TargetMetrics) Request(code int) { m.requests.Inc(statusSlot(code)) }

// Requests returns the finished requests so far, all statuses together.
func (m *TargetMetrics) Requests() uint64 {
	var n uint64
	for _, v := range m.requests.Values() {
		n += v
	}
	return n
}

// UpstreamError counts a failed attempt of the given kind (index into failKinds).
func (m *TargetMetrics) UpstreamError(kind int) { m.upstreamErrors.Inc(kind) }

// TrieResetReasons are the reason label of rolter_trie_resets_total.
var TrieResetReasons = []string{"engine_restart", "recovered", "stale"}

// TrieReset counts a target's prefix trie emptied, for TrieResetReasons[reason].
func (m *TargetMetrics) TrieReset(reason int) { m.trieResets.Inc(reason) }

// StreamError counts a response that failed after its first byte reached the client.
func (m *TargetMetrics) StreamError(kind int) { m.streamErrors.Inc(kind) }

// RouteMetrics are the per-route handles.
type RouteMetrics struct {
	decisions  *lazyCounters
	Retries    *metrics.Counter
	Retried    *metrics.Counter
	ClientGone *metrics.Counter
	FailOpen   *metrics.Counter
	Rejected   *metrics.Counter
	Decision   *metrics.PrometheusHistogram
	// Unrouted counts requests answered before any target was chosen (the route has no target left, etc.).
	Unrouted *lazyCounters
}

// NewRouteMetrics creates the handles for one route.
func (s *Set) NewRouteMetrics(route, strategy string, reasons []string) *RouteMetrics {
	l := "route=" + Label(route)
	s.s.NewGauge(mConfigInfo+"{"+l+",strategy="+Label(strategy)+"}", func() float64 { return 1 })
	return &RouteMetrics{
		decisions:  newLazyCounters(s.s, mDecisions, l+",strategy="+Label(strategy), "decision", reasons),
		Retries:    s.s.NewCounter(mRetries + "{" + l + "}"),
		Retried:    s.s.NewCounter(mRequestsRetried + "{" + l + "}"),
		ClientGone: s.s.NewCounter(mClientGone + "{" + l + "}"),
		FailOpen:   s.s.NewCounter(mNoTarget + "{" + l + `,action="fail_open"}`),
		Rejected:   s.s.NewCounter(mNoTarget + "{" + l + `,action="reject"}`),
		Decision:   s.s.NewPrometheusHistogramExt(mDecisionLatency+"{"+l+"}", latencyBuckets),
		Unrouted:   newLazyCounters(s.s, mRequests, l+`,target=""`, "code", statusNames),
	}
}

// Decision counts one routing decision by reason index.
func (m *RouteMetrics) DecisionMade(reason int) { m.decisions.Inc(reason) }

// Decisions returns the route's decisions so far, by reason.
func (m *RouteMetrics) Decisions() map[string]uint64 { return m.decisions.Values() }

// UnroutedRequest counts a request of this route answered without reaching a target.
func (m *RouteMetrics) UnroutedRequest(code int) { m.Unrouted.Inc(statusSlot(code)) }

// Global holds the gateway-wide handles that do not depend on the config. Each Gateway has its own, on a
// Set of its own: exported from the end of New until Shutdown, like the gateway's other sets.
type Global struct {
	set *Set

	badRequests     *lazyCounters
	admissionGlobal *metrics.Counter
	admissionTarget *metrics.Counter
	admissionMemory *metrics.Counter

	clientConns    atomic.Int64
	clientParked   atomic.Int64
	clientRejected *lazyCounters
	acceptErrors   *metrics.Counter
	egressRefused  *lazyCounters

	controlConns    atomic.Int64
	controlRejected *metrics.Counter
}

// ClientRejectReasons are the reasons of rolter_client_connections_rejected_total: a connection refused on
// arrival for [server] max_conns_per_ip, or an idle one closed to make room under max_conns.
var ClientRejectReasons = []string{"max_conns_per_ip", "reclaimed_idle"}

// badRequestCodes are the error codes of requests rejected before routing.
var badRequestCodes = []string{
	"invalid_json", "invalid_body", "missing_model", "invalid_model", "model_not_found", "method_not_allowed",
	"request_too_large", "unsupported_media_type", "header_too_large", "not_found", "duplicate_model", "bad_request",
}

// Admission counts a request refused by admission control: "global" (queue.max_inflight), "target" (a
// target's cap and queue) or "body_memory" (server.max_body_memory_bytes).
func (g *Global) Admission(scope string) {
	switch scope {
	case "global":
		g.admissionGlobal.Inc()
	case "body_memory":
		g.admissionMemory.Inc()
	default:
		g.admissionTarget.Inc()
	}
}

// NewGlobal creates one gateway's gateway-wide metrics; they are exported once Register is called. start
// is reported as the process start, and draining says whether that gateway is shutting down.
//
// rolter_build_info, rolter_uptime_seconds and rolter_process_start_time_seconds describe the process, not
// the gateway. They live here because production runs one gateway per process; a process with several
// registered gateways (tests) exports them, and every other series here, once per gateway under the same
// names and labels. That is fine for tests, which look values up by substring, and is not a valid
// exposition for a real scraper.
func NewGlobal(version string, start time.Time, draining func() bool) *Global {
	g := &Global{set: NewSet()}
	s := g.set
	s.Gauge(mBuildInfo, "version="+Label(version), func() float64 { return 1 })
	s.Gauge(mProcessStart, "", func() float64 { return float64(start.UnixNano()) / 1e9 })
	s.Gauge(mUptime, "", func() float64 { return time.Since(start).Seconds() })
	s.Gauge(mDrain, "", func() float64 {
		if draining() {
			return 1
		}
		return 0
	})
	g.badRequests = newLazyCounters(s.s, mBadRequests, "", "code", badRequestCodes)
	g.admissionGlobal = s.Counter(mAdmission, `scope="global"`)
	g.admissionTarget = s.Counter(mAdmission, `scope="target"`)
	g.admissionMemory = s.Counter(mAdmission, `scope="body_memory"`)
	g.clientRejected = newLazyCounters(s.s, mClientRejected, "", "reason", ClientRejectReasons)
	g.acceptErrors = s.Counter(mAcceptErrors, "")
	g.egressRefused = newLazyCounters(s.s, mEgressRefused, "", "use", EgressUses)
	s.Gauge(mClientConns, "", func() float64 { return float64(g.clientConns.Load()) })
	s.Gauge(mClientParked, "", func() float64 { return float64(g.clientParked.Load()) })
	g.controlRejected = s.Counter(mControlRejected, "")
	s.Gauge(mControlConns, "", func() float64 { return float64(g.controlConns.Load()) })
	return g
}

// Register exports the series; Unregister removes them for good. The handles keep working after
// Unregister (a connection closing after Shutdown still counts), they are just no longer exported.
func (g *Global) Register()   { g.set.Register() }
func (g *Global) Unregister() { g.set.Unregister() }

// ClientConns adds delta to the gateway's open client connections. Safe for concurrent use.
func (g *Global) ClientConns(delta int64) { g.clientConns.Add(delta) }

// ClientParked adds delta to the gateway's parked client connections. Safe for concurrent use.
func (g *Global) ClientParked(delta int64) { g.clientParked.Add(delta) }

// ClientRejected counts a client connection the listener closed, by index into ClientRejectReasons.
func (g *Global) ClientRejected(reason int) { g.clientRejected.Inc(reason) }

// ControlConns adds delta to the control plane's open connections. Safe for concurrent use.
func (g *Global) ControlConns(delta int64) { g.controlConns.Add(delta) }

// ControlRejected counts a control-plane connection closed on arrival at [control] max_conns.
func (g *Global) ControlRejected() { g.controlRejected.Inc() }

// AcceptError counts a failed accept.
func (g *Global) AcceptError() { g.acceptErrors.Inc() }

// EgressUses are the connections the egress policy checks, the use label of rolter_egress_refused_total.
var EgressUses = []string{"proxy", "health", "scrape", "lmcache", "kv_events", "tracing", "cluster"}

// EgressRefused counts a connection the egress policy refused, by index into EgressUses.
func (g *Global) EgressRefused(use int) { g.egressRefused.Inc(use) }

// BadRequest counts a rejected request by its error code.
func (g *Global) BadRequest(code string) {
	for i, c := range badRequestCodes {
		if c == code {
			g.badRequests.Inc(i)
			return
		}
	}
	g.badRequests.Inc(len(badRequestCodes) - 1)
}

// Names of gauges other packages register through Set.Gauge.
const (
	InflightGauge     = mInflight
	UpstreamConns     = mUpstreamConns
	TrieNodes         = mTrieNodes
	TrieEdgeBytes     = mTrieBytes
	TrieArenaBytes    = mTrieArena
	TriePrompts       = mTriePrompts
	TrieEvictions     = mTrieEvictions
	TargetEligible    = mTargetEligible
	CooldownRemaining = mCooldownSecs
	BreakerState      = mBreakerState
	EngineRunning     = mEngineRunning
	EngineWaiting     = mEngineWaiting
	EngineKVUsage     = mScrapeQueue
	KVBlocks          = mKVBlocks
	KVTrusted         = mKVTrusted
	KVLastSeq         = mKVLastSeq
	Sessions          = mSessions

	ShadowRanked        = mShadowRanked
	ShadowEnded         = mShadowEnded
	ShadowAgreed        = mShadowAgreed
	ShadowDropped       = mShadowDropped
	ShadowReuseScored   = mShadowReuseScored
	ShadowReuseHeld     = mShadowReuseHeld
	ShadowReuseCaptured = mShadowReuseCaptured
	ShadowLoadCoV       = mShadowLoadCoV
	TraceRecords        = mTraceRecords
	EngineCacheResets   = mCacheResets
	AccessLogLines      = mAccessLogLines
	TracingSpans        = mTracingSpans
	QueueWaiting        = mQueueWaiting
	TargetStates        = mTargetState
	HealthChecks        = mHealthChecks
	Scrapes             = mScrapes
	KVEvents            = mKVEvents
	KVStream            = mKVStream
	LMCachePolls        = mLMCachePolls
	Admission           = mAdmission
)

// Gateway replicas sharing routing evidence and in-flight counts over NATS (package cluster). Messages and
// the slow_consumer drops count NATS messages; queue_full counts requests whose evidence was not queued.
const (
	ClusterConnected       = "rolter_cluster_connected"        // gauge 0/1
	ClusterPeers           = "rolter_cluster_peers"            // gauge: peer replicas heard from recently
	ClusterMessages        = "rolter_cluster_messages_total"   // {kind,direction} evidence | load, sent | received
	ClusterDropped         = "rolter_cluster_dropped_total"    // {reason} queue_full | malformed | publish_failed | slow_consumer
	ClusterRefused         = "rolter_cluster_refused_total"    // {reason} unauthenticated | bad_mac | stale | replayed | too_many_peers | rate_limited | inflight_capped
	ClusterEvidenceEntries = "rolter_cluster_evidence_entries" // gauge: occupied slots of the peers' evidence table
)
