package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// The poll loop every source of outside state shares: a Scraper (scrape.go), an LMCachePoller
// (lmcache.go) and a ModelsPoller (models.go) each configure a poller with what to fetch and how to read
// a body, and own the state it writes (EngineLoad and Adapters, CacheStatus, Adapters). The package doc
// describes the shape they share.

// Defaults applied to zero fields of all pollers' configs.
const (
	DefaultPollTimeout      = 2 * time.Second
	defaultMaxIdleConnDelay = 4 * time.Second
)

// padBytes keeps a target's polled state (EngineLoad, CacheStatus) on cache lines of its own: it is read
// on every routing decision, and it usually sits in a struct next to per-request counters (in-flight,
// errors) that are written all the time.
const padBytes = 64

// PollStats describes the polls of a Scraper, LMCachePoller or ModelsPoller so far.
type PollStats struct {
	OK     uint64
	Failed uint64
	// LastError is the error of the most recent failed poll, kept after later successes; nil if none.
	LastError error
	// LastDuration is how long the most recent poll took.
	LastDuration time.Duration
}

// pollerConfig is what a Scraper, LMCachePoller or ModelsPoller hands to the shared poll loop.
type pollerConfig struct {
	what       string
	url        string
	cfgErr     error
	accept     string
	interval   time.Duration
	timeout    time.Duration
	maxBody    int
	headers    map[string]string
	dialer     func(ctx context.Context, network, addr string) (net.Conn, error)
	handle     func(body []byte) error // called with a 200 body, valid only during the call
	invalidate func()
	logger     *slog.Logger
}

// poller is the loop shared by Scraper, LMCachePoller and ModelsPoller: one goroutine, one fasthttp.HostClient,
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
	// sent is when the poll in flight was sent: what its answer says held at some time after it, so a
	// handler stamps what it stores with sent, not with when the answer arrived.
	sent time.Time
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
	p.sent = start
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
	if p.dialer != nil {
		// Each poll dials (and so is checked) anew.
		defer p.hc.CloseIdleConnections()
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
	ctx, cancel := context.WithTimeout(p.ctx, timeout)
	defer cancel()
	var c net.Conn
	var err error
	if p.dialer != nil {
		c, err = p.dialer(ctx, "tcp", addr)
	} else {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", addr)
	}
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
