package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Defaults applied to zero fields of ScrapeConfig and LMCacheConfig.
const (
	DefaultScrapePath       = "/metrics"
	DefaultScrapeInterval   = 5 * time.Second
	DefaultPollTimeout      = 2 * time.Second
	DefaultScrapeMaxBody    = 8 << 20
	DefaultLMCacheRefresh   = 2 * time.Second
	DefaultLMCacheMaxBody   = 64 << 10
	defaultMaxIdleConnDelay = 4 * time.Second
)

// padBytes keeps a target's scraped state on cache lines of its own: it is read on every routing
// decision, and it usually sits in a struct next to per-request counters (in-flight, errors) that are
// written all the time.
const padBytes = 64

// EngineLoad is the engine-side load of one target as last scraped from its /metrics: requests
// running, requests waiting and KV-cache usage. One Scraper writes it; routing reads it.
//
// All methods are safe for concurrent use and do not allocate. An EngineLoad must not be copied.
type EngineLoad struct {
	_         [padBytes]byte
	running   atomic.Int64
	waiting   atomic.Int64
	kvUsage   atomic.Uint64 // math.Float64bits; NaN when the engine does not expose it
	updatedAt atomic.Int64  // unix nanoseconds of the last successful scrape
	baseline  atomic.Int64  // the caller's own in-flight count when the scrape was read (ScrapeConfig.Baseline)
	valid     atomic.Bool
	_         [padBytes]byte
}

// Store records a successful scrape taken at now (unix nanoseconds). kvUsage may be NaN when the
// engine exposes no KV-cache usage.
func (l *EngineLoad) Store(running, waiting int64, kvUsage float64, now int64) {
	l.running.Store(running)
	l.waiting.Store(waiting)
	l.kvUsage.Store(math.Float64bits(kvUsage))
	l.updatedAt.Store(now)
	l.valid.Store(true)
}

// External returns how many of the engine's requests (running + waiting) are not the caller's own: the
// engine's count minus ScrapeConfig.Baseline sampled when the scrape was read, at least 0. ok follows the
// rule of Queue. It lets a gateway add other clients' load to its own fresh in-flight count without
// counting its own requests twice.
func (l *EngineLoad) External(now, maxAge int64) (int64, bool) {
	r, w, ok := l.Queue(now, maxAge)
	if !ok {
		return 0, false
	}
	return max(0, r+w-l.baseline.Load()), true
}

// Invalidate drops the current values: until the next Store, Queue and KVUsage report not ok.
// A failed scrape calls it at once, so routing never leans on a number the engine no longer vouches for.
func (l *EngineLoad) Invalidate() {
	l.valid.Store(false)
}

// Queue returns the engine's running and waiting request counts. ok is false, and the counts are
// zero, unless the last scrape succeeded and is younger than maxAge nanoseconds at now (unix
// nanoseconds); maxAge <= 0 disables the age check. The two counts are read one after the other, so
// when a scrape lands in between they may come from two consecutive scrapes.
func (l *EngineLoad) Queue(now, maxAge int64) (running, waiting int64, ok bool) {
	if !l.fresh(now, maxAge) {
		return 0, 0, false
	}
	return l.running.Load(), l.waiting.Load(), true
}

// KVUsage returns the engine's KV-cache usage (0..1) under the same freshness rule as Queue; ok is
// also false when the engine does not expose a usage gauge.
func (l *EngineLoad) KVUsage(now, maxAge int64) (usage float64, ok bool) {
	if !l.fresh(now, maxAge) {
		return 0, false
	}
	u := math.Float64frombits(l.kvUsage.Load())
	if math.IsNaN(u) {
		return 0, false
	}
	return u, true
}

func (l *EngineLoad) fresh(now, maxAge int64) bool {
	if !l.valid.Load() {
		return false
	}
	return maxAge <= 0 || now-l.updatedAt.Load() < maxAge
}

// LoadSample is the engine load read from one /metrics body.
type LoadSample struct {
	Running int64
	Waiting int64
	// KVUsage is the mean KV-cache usage (0..1) over the engines in the body, NaN when none is exposed.
	KVUsage float64
	// Source says which metric names were found: "vllm" or "sglang".
	Source string
}

// ParseEngineLoad reads the engine load from a Prometheus text body (docs/architecture.md, "Facts about
// engine metrics").
//
// vLLM names come first: vllm:num_requests_running, vllm:num_requests_waiting and
// vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc of older versions when the new gauge is absent).
// Only when no vLLM queue series is present are SGLang names used: sglang:num_running_reqs,
// sglang:num_queue_reqs and sglang:token_usage. Queue counts are summed over all matching series
// (several `engine` labels with data parallelism, several `dp_rank` for SGLang); KV usage is their
// mean. NaN and infinite values are skipped and negative sums count as zero.
//
// When modelName is not empty, series whose model_name label differs are skipped; series without a
// model_name label still count (they cannot belong to another model). A body without any queue series
// is an error. Garbage lines are skipped.
func ParseEngineLoad(body []byte, modelName string) (LoadSample, error) {
	var sc Scanner
	return parseEngineLoad(&sc, body, modelName)
}

type loadSeries struct {
	sum float64
	n   int
}

func (s *loadSeries) mean() float64 {
	if s.n == 0 {
		return math.NaN()
	}
	return s.sum / float64(s.n)
}

func (s *loadSeries) count() int64 {
	return int64(max(0, math.Round(s.sum)))
}

func parseEngineLoad(sc *Scanner, body []byte, modelName string) (LoadSample, error) {
	var vRun, vWait, vKV, vGPU, sRun, sWait, sKV loadSeries
	otherModel := false
	sc.Init(body)
	for sc.Next() {
		s := sc.Sample()
		var dst *loadSeries
		switch string(s.Name) {
		case "vllm:num_requests_running":
			dst = &vRun
		case "vllm:num_requests_waiting":
			dst = &vWait
		case "vllm:kv_cache_usage_perc":
			dst = &vKV
		case "vllm:gpu_cache_usage_perc":
			// Deprecated in vLLM 0.10 and removed later (vllm-project/vllm#29330), still served by
			// older engines in the field.
			dst = &vGPU
		case "sglang:num_running_reqs":
			dst = &sRun
		case "sglang:num_queue_reqs":
			dst = &sWait
		case "sglang:token_usage":
			dst = &sKV
		default:
			continue
		}
		if math.IsNaN(s.Value) || math.IsInf(s.Value, 0) {
			continue
		}
		if modelName != "" {
			if m, ok := s.Label("model_name"); ok && string(m) != modelName {
				otherModel = true
				continue
			}
		}
		dst.sum += s.Value
		dst.n++
	}
	switch {
	case vRun.n > 0 || vWait.n > 0:
		kv := vKV.mean()
		if vKV.n == 0 {
			kv = vGPU.mean()
		}
		return LoadSample{Running: vRun.count(), Waiting: vWait.count(), KVUsage: kv, Source: "vllm"}, nil
	case sRun.n > 0 || sWait.n > 0:
		return LoadSample{Running: sRun.count(), Waiting: sWait.count(), KVUsage: sKV.mean(), Source: "sglang"}, nil
	}
	if otherModel {
		return LoadSample{}, fmt.Errorf("cannot find engine load series for model_name %q", modelName)
	}
	if err := sc.Err(); err != nil {
		return LoadSample{}, fmt.Errorf("cannot find engine load series (vllm:num_requests_* or sglang:num_*_reqs) among %d garbage lines: %w", sc.BadLines(), err)
	}
	return LoadSample{}, errNoLoadSeries
}

var errNoLoadSeries = errors.New("cannot find engine load series (vllm:num_requests_* or sglang:num_*_reqs)")

// ScrapeConfig configures one Scraper. Zero fields take the Default* values.
type ScrapeConfig struct {
	// BaseURL is the engine's server root, http[s]://host[:port][/prefix]; Path is appended to it.
	BaseURL string
	// Path is the metrics path, "/metrics" by default.
	Path string
	// ModelName, when set, keeps only series whose model_name label equals it.
	ModelName string
	// Interval is the time between scrapes; Timeout bounds each scrape, connect included.
	Interval time.Duration
	Timeout  time.Duration
	// Headers are sent with every scrape, e.g. Authorization.
	Headers map[string]string
	// MaxBodySize caps the body read (8 MiB by default); a larger body is a failed scrape.
	MaxBodySize int
	// Check, when set, is called with the full URL before every request (the egress policy); an error
	// makes that scrape fail without touching the network.
	Check func(url string) error
	// Baseline, when set, is sampled as each scrape is read: the caller's own in-flight requests to the
	// engine, used by EngineLoad.External.
	Baseline func() int64
}

// URL returns the full scrape URL.
func (c *ScrapeConfig) URL() (string, error) {
	if _, _, err := parseEndpoint(c.BaseURL); err != nil {
		return "", err
	}
	if strings.ContainsAny(c.BaseURL, "?#") {
		return "", fmt.Errorf("cannot use base URL %q: it must not have a query or fragment", c.BaseURL)
	}
	path := c.Path
	if path == "" {
		path = DefaultScrapePath
	}
	if !strings.HasPrefix(path, "/") {
		return "", fmt.Errorf("cannot use metrics path %q: it must start with '/'", path)
	}
	return strings.TrimSuffix(c.BaseURL, "/") + path, nil
}

// Validate reports every problem of c at once.
func (c *ScrapeConfig) Validate() error {
	var errs []error
	if _, err := c.URL(); err != nil {
		errs = append(errs, err)
	}
	errs = appendNegativeError(errs, "interval", c.Interval)
	errs = appendNegativeError(errs, "timeout", c.Timeout)
	errs = appendNegativeError(errs, "max body size", c.MaxBodySize)
	return errors.Join(errs...)
}

// Scraper polls one engine's /metrics every interval and stores the load it reads in an EngineLoad.
// It runs one goroutine with at most one scrape in flight. A scrape that fails (egress denied, connect
// error, timeout, non-200 status, body too large, no load series) invalidates the EngineLoad at once.
//
// Start and Stop are safe for concurrent use; a Scraper runs at most once (Start after Stop does
// nothing).
type Scraper struct {
	p        *poller
	load     *EngineLoad
	model    string
	baseline func() int64
	sc       Scanner // used only by the poll goroutine
}

// NewScraper returns a Scraper for cfg writing to load. A nil logger means slog.Default(). An invalid
// cfg is not fatal here (config validation reports it through ScrapeConfig.Validate): every scrape of
// such a Scraper fails with the validation error.
func NewScraper(cfg ScrapeConfig, load *EngineLoad, logger *slog.Logger) *Scraper {
	s := &Scraper{load: load, model: cfg.ModelName, baseline: cfg.Baseline}
	u, _ := cfg.URL()
	if u == "" {
		u = cfg.BaseURL + cfg.Path // for log lines only: every scrape fails with the Validate error
	}
	err := cfg.Validate()
	s.p = newPoller(pollerConfig{
		what:       "metrics scrape",
		url:        u,
		cfgErr:     err,
		accept:     "text/plain;version=0.0.4;q=1,*/*;q=0.1",
		interval:   orDefault(cfg.Interval, DefaultScrapeInterval),
		timeout:    orDefault(cfg.Timeout, DefaultPollTimeout),
		maxBody:    orDefault(cfg.MaxBodySize, DefaultScrapeMaxBody),
		headers:    cfg.Headers,
		check:      cfg.Check,
		handle:     s.handle,
		invalidate: load.Invalidate,
		logger:     logger,
	})
	return s
}

func (s *Scraper) handle(body []byte) error {
	ls, err := parseEngineLoad(&s.sc, body, s.model)
	if err != nil {
		return fmt.Errorf("cannot read engine load from %q: %w", s.p.url, err)
	}
	if s.baseline != nil {
		s.load.baseline.Store(s.baseline())
	}
	s.load.Store(ls.Running, ls.Waiting, ls.KVUsage, time.Now().UnixNano())
	return nil
}

// Start starts the poll goroutine; the first scrape happens at once.
func (s *Scraper) Start() { s.p.start() }

// Stop stops the poll goroutine and waits for it. A scrape in flight is aborted by closing its
// connection, so Stop does not wait for a hanging engine. The EngineLoad keeps its last values (the
// caller owns it and its staleness rule).
func (s *Scraper) Stop() { s.p.stop() }

// Stats returns the scrape counters. Safe for concurrent use.
func (s *Scraper) Stats() PollStats { return s.p.stats() }

// PollStats describes the polls of a Scraper or LMCachePoller so far.
type PollStats struct {
	OK     uint64
	Failed uint64
	// LastError is the error of the most recent failed poll, kept after later successes; nil if none.
	LastError error
	// LastDuration is how long the most recent poll took.
	LastDuration time.Duration
}

// pollerConfig is what a Scraper or LMCachePoller hands to the shared poll loop.
type pollerConfig struct {
	what       string
	url        string
	cfgErr     error
	accept     string
	interval   time.Duration
	timeout    time.Duration
	maxBody    int
	headers    map[string]string
	check      func(url string) error
	handle     func(body []byte) error // called with a 200 body, valid only during the call
	invalidate func()
	logger     *slog.Logger
}

// poller is the loop shared by Scraper and LMCachePoller: one goroutine, one fasthttp.HostClient,
// one request and response reused for every poll, at most one poll in flight.
type poller struct {
	pollerConfig
	hc *fasthttp.HostClient

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex // guards started, stopped, conns and lastErr
	started bool
	stopped bool
	conns   map[*trackedConn]struct{}
	lastErr error

	okCount      atomic.Uint64
	failCount    atomic.Uint64
	lastDuration atomic.Int64

	pollMu  sync.Mutex // serialises polls; guards the fields below
	req     fasthttp.Request
	resp    fasthttp.Response
	failing bool
}

func newPoller(cfg pollerConfig) *poller {
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	cfg.logger = cfg.logger.With("component", cfg.what, "url", cfg.url)
	p := &poller{pollerConfig: cfg, conns: make(map[*trackedConn]struct{})}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	if cfg.cfgErr != nil {
		return p
	}
	addr, isTLS, err := parseEndpoint(cfg.url)
	if err != nil {
		p.cfgErr = err
		return p
	}
	p.hc = &fasthttp.HostClient{
		Addr:                addr,
		IsTLS:               isTLS,
		Name:                "rolter",
		DialTimeout:         p.dial,
		MaxConns:            1,
		MaxConnWaitTimeout:  cfg.timeout,
		MaxIdleConnDuration: defaultMaxIdleConnDelay,
		MaxResponseBodySize: cfg.maxBody,
	}
	return p
}

func (p *poller) start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started || p.stopped {
		return
	}
	p.started = true
	p.wg.Add(1)
	go p.run()
}

func (p *poller) stop() {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		p.wg.Wait()
		return
	}
	p.stopped = true
	p.cancel()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()

	// fasthttp has no context: closing the connection is what interrupts a poll stuck on a hanging
	// endpoint, so Stop does not wait up to Timeout.
	for c := range conns {
		_ = c.Close()
	}
	p.wg.Wait()
	if p.hc != nil {
		p.hc.CloseIdleConnections()
	}
}

func (p *poller) run() {
	defer p.wg.Done()
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		p.pollOnce()
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pollOnce runs one poll and records its outcome. A poll that Stop interrupted is not counted: it
// says nothing about the endpoint.
func (p *poller) pollOnce() {
	p.pollMu.Lock()
	defer p.pollMu.Unlock()
	if p.ctx.Err() != nil {
		return
	}
	start := time.Now()
	err := p.fetch()
	p.lastDuration.Store(int64(time.Since(start)))
	if err == nil {
		p.okCount.Add(1)
		if p.failing {
			p.failing = false
			p.logger.Info("poll recovered")
		}
		return
	}
	if p.ctx.Err() != nil {
		return
	}
	p.invalidate()
	p.failCount.Add(1)
	p.mu.Lock()
	p.lastErr = err
	p.mu.Unlock()
	// Log state changes, not every interval of a long outage.
	if !p.failing {
		p.failing = true
		p.logger.Warn("poll failed; ignoring this source until it recovers", "err", err)
	} else {
		p.logger.Debug("poll failed", "err", err)
	}
}

func (p *poller) fetch() (err error) {
	defer func() {
		if r := recover(); r != nil {
			p.logger.Error("panic during poll", "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("cannot poll %q: panic: %v", p.url, r)
		}
	}()
	if p.cfgErr != nil {
		return p.cfgErr
	}
	if p.check != nil {
		if err := p.check(p.url); err != nil {
			return fmt.Errorf("cannot poll %q: egress policy: %w", p.url, err)
		}
	}
	req, resp := &p.req, &p.resp
	req.Reset()
	resp.Reset()
	req.SetRequestURI(p.url)
	req.Header.SetMethod(fasthttp.MethodGet)
	req.Header.Set(fasthttp.HeaderAccept, p.accept)
	for k, v := range p.headers {
		req.Header.Set(k, v)
	}
	if err := p.hc.DoTimeout(req, resp, p.timeout); err != nil {
		return fmt.Errorf("cannot poll %q: %w", p.url, err)
	}
	if code := resp.StatusCode(); code != fasthttp.StatusOK {
		return fmt.Errorf("cannot poll %q: unexpected status code %d", p.url, code)
	}
	return p.handle(resp.Body())
}

func (p *poller) stats() PollStats {
	p.mu.Lock()
	lastErr := p.lastErr
	p.mu.Unlock()
	return PollStats{
		OK:           p.okCount.Load(),
		Failed:       p.failCount.Load(),
		LastError:    lastErr,
		LastDuration: time.Duration(p.lastDuration.Load()),
	}
}

var errPollerStopped = errors.New("poller stopped")

// dial is the HostClient's DialTimeout: it honours the poll timeout, gives up when the poller stops,
// and tracks the connection so that stop can close it.
func (p *poller) dial(addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(p.ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		_ = c.Close()
		return nil, errPollerStopped
	}
	tc := &trackedConn{Conn: c, p: p}
	p.conns[tc] = struct{}{}
	return tc, nil
}

type trackedConn struct {
	net.Conn
	p    *poller
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.p.mu.Lock()
		delete(c.p.conns, c)
		c.p.mu.Unlock()
	})
	return c.Conn.Close()
}

// parseEndpoint checks an http(s) URL and returns the host:port to dial and whether it needs TLS.
func parseEndpoint(raw string) (addr string, isTLS bool, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", false, fmt.Errorf("cannot parse URL %q: %w", raw, err)
	}
	port := "80"
	switch u.Scheme {
	case "http":
	case "https":
		isTLS, port = true, "443"
	default:
		return "", false, fmt.Errorf("cannot use URL %q: scheme must be http or https", raw)
	}
	if u.Hostname() == "" {
		return "", false, fmt.Errorf("cannot use URL %q: missing host", raw)
	}
	if u.User != nil {
		return "", false, fmt.Errorf("cannot use URL %q: credentials in the URL are not supported; send them as a header", raw)
	}
	if u.Fragment != "" {
		return "", false, fmt.Errorf("cannot use URL %q: it must not have a fragment", raw)
	}
	if p := u.Port(); p != "" {
		port = p
	}
	return net.JoinHostPort(u.Hostname(), port), isTLS, nil
}

func appendNegativeError[T time.Duration | int](errs []error, name string, v T) []error {
	if v < 0 {
		return append(errs, fmt.Errorf("cannot use %s %v: it must not be negative", name, v))
	}
	return errs
}

func orDefault[T time.Duration | int](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}
