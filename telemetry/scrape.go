package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"
)

// Defaults applied to zero fields of ScrapeConfig (DefaultPollTimeout, in poller.go, bounds each scrape).
const (
	DefaultScrapePath     = "/metrics"
	DefaultScrapeInterval = 5 * time.Second
	DefaultScrapeMaxBody  = 8 << 20
)

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
	// Dial, when set, makes the scrape's connections (the gateway's egress-policy dialer). Connections are
	// then not kept between scrapes: every scrape is dialled, and checked, again.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Baseline, when set, is sampled as each scrape is read: the caller's own in-flight requests to the
	// engine, used by EngineLoad.External.
	Baseline func() int64
	// OnRestart, when set, is called (on the poll goroutine) when the engine's process_start_time_seconds
	// changes between two scrapes: the engine restarted, and its prefix cache is empty.
	OnRestart func()
	// Adapters, when set, gets each scrape's LoRA sample (LoadSample.LoRA; a body without the series
	// stores a batch that was not seen) and is invalidated by a failed scrape.
	Adapters *Adapters
}

// URL returns the full scrape URL.
func (c *ScrapeConfig) URL() (string, error) {
	return endpointURL(c.BaseURL, c.Path, DefaultScrapePath, "metrics path")
}

// endpointURL joins an engine's base URL and a path (def when empty); what names the path in errors.
func endpointURL(base, path, def, what string) (string, error) {
	if _, _, err := parseEndpoint(base); err != nil {
		return "", err
	}
	if strings.ContainsAny(base, "?#") {
		return "", fmt.Errorf("cannot use base URL %q: it must not have a query or fragment", base)
	}
	if path == "" {
		path = def
	}
	if !strings.HasPrefix(path, "/") {
		return "", fmt.Errorf("cannot use %s %q: it must start with '/'", what, path)
	}
	return strings.TrimSuffix(base, "/") + path, nil
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
	restart  func()
	adapters *Adapters
	start    float64 // the last process_start_time_seconds seen; poll goroutine only
	sc       Scanner // used only by the poll goroutine
}

// NewScraper returns a Scraper for cfg writing to load. A nil logger means slog.Default(). An invalid
// cfg is not fatal here (config validation reports it through ScrapeConfig.Validate): every scrape of
// such a Scraper fails with the validation error.
func NewScraper(cfg ScrapeConfig, load *EngineLoad, logger *slog.Logger) *Scraper {
	s := &Scraper{load: load, model: cfg.ModelName, baseline: cfg.Baseline, restart: cfg.OnRestart, adapters: cfg.Adapters}
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
		dialer:     cfg.Dial,
		handle:     s.handle,
		invalidate: s.invalidate,
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
	now := time.Now().UnixNano()
	s.load.Store(ls.Running, ls.Waiting, ls.KVUsage, now)
	if s.adapters != nil {
		s.adapters.StoreBatch(ls.LoRA, now)
	}
	if ls.StartTime > 0 {
		if s.start > 0 && ls.StartTime != s.start && s.restart != nil {
			s.restart()
		}
		s.start = ls.StartTime
	}
	return nil
}

func (s *Scraper) invalidate() {
	s.load.Invalidate()
	if s.adapters != nil {
		s.adapters.InvalidateBatch()
	}
}

// Start starts the poll goroutine; the first scrape happens at once.
func (s *Scraper) Start() { s.p.start() }

// Stop stops the poll goroutine and waits for it. A scrape in flight is aborted by closing its
// connection, so Stop does not wait for a hanging engine. The EngineLoad keeps its last values (the
// caller owns it and its staleness rule).
func (s *Scraper) Stop() { s.p.stop() }

// Stats returns the scrape counters. Safe for concurrent use.
func (s *Scraper) Stats() PollStats { return s.p.stats() }
