package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync/atomic"
	"time"

	"github.com/valyala/fastjson"
)

// CacheStatus is the state of one target's LMCache controller as last polled: how full the cache is
// and whether it takes new entries. It feeds the `lmcache_aware` strategy, which prefers available targets
// with more free cache capacity and treats failed and stale controllers as neutral (docs/architecture.md,
// "Routing rules").
// One LMCachePoller writes it; routing reads it.
//
// All methods are safe for concurrent use and do not allocate. A CacheStatus must not be copied.
type CacheStatus struct {
	_         [padBytes]byte
	occupancy atomic.Uint64 // math.Float64bits, 0..1
	available atomic.Bool
	updatedAt atomic.Int64 // unix nanoseconds of the last successful poll
	valid     atomic.Bool
	_         [padBytes]byte
}

// Store records a successful poll taken at now (unix nanoseconds).
func (s *CacheStatus) Store(occupancy float64, available bool, now int64) {
	s.occupancy.Store(math.Float64bits(occupancy))
	s.available.Store(available)
	s.updatedAt.Store(now)
	s.valid.Store(true)
}

// Invalidate drops the current status: until the next Store, Get reports not ok.
func (s *CacheStatus) Invalidate() {
	s.valid.Store(false)
}

// Get returns the cache occupancy (0..1) and availability. ok is false, with zero values, unless the
// last poll succeeded and is younger than maxAge nanoseconds at now (unix nanoseconds); maxAge <= 0
// disables the age check. A not-ok status must be treated as neutral, not as "full" or "empty".
func (s *CacheStatus) Get(now, maxAge int64) (occupancy float64, available, ok bool) {
	if !s.valid.Load() {
		return 0, false, false
	}
	if maxAge > 0 && now-s.updatedAt.Load() >= maxAge {
		return 0, false, false
	}
	return math.Float64frombits(s.occupancy.Load()), s.available.Load(), true
}

// ParseCacheStatus reads an LMCache status body: a JSON object with "occupancy", a number in [0, 1],
// and "cache_available", a boolean. Other fields are ignored; anything else is an error. p is used for
// parsing and must not be shared between goroutines; ParseCacheStatus does not allocate once p is warm.
func ParseCacheStatus(p *fastjson.Parser, body []byte) (occupancy float64, available bool, err error) {
	v, err := p.ParseBytes(body)
	if err != nil {
		return 0, false, fmt.Errorf("cannot parse LMCache status JSON: %w", err)
	}
	if v.Type() != fastjson.TypeObject {
		return 0, false, errCacheStatusObject
	}
	o := v.Get("occupancy")
	if o == nil || o.Type() != fastjson.TypeNumber {
		return 0, false, errCacheStatusOccupancy
	}
	occupancy, err = o.Float64()
	if err != nil || !(occupancy >= 0 && occupancy <= 1) {
		return 0, false, fmt.Errorf("cannot use LMCache occupancy %s: it must be a number in [0, 1]", o)
	}
	a := v.Get("cache_available")
	if a == nil {
		return 0, false, errCacheStatusAvailable
	}
	available, err = a.Bool()
	if err != nil {
		return 0, false, errCacheStatusAvailable
	}
	return occupancy, available, nil
}

var (
	errCacheStatusObject    = errors.New("cannot use LMCache status: it must be a JSON object")
	errCacheStatusOccupancy = errors.New(`cannot use LMCache status: "occupancy" must be a number`)
	errCacheStatusAvailable = errors.New(`cannot use LMCache status: "cache_available" must be true or false`)
)

// Defaults applied to zero fields of LMCacheConfig (DefaultPollTimeout, in poller.go, bounds each poll).
const (
	DefaultLMCacheRefresh = 2 * time.Second
	DefaultLMCacheMaxBody = 64 << 10
)

// LMCacheConfig configures one LMCachePoller. Zero fields take the Default* values.
type LMCacheConfig struct {
	// URL is the full status endpoint, http[s]://host[:port]/path[?query].
	URL string
	// Refresh is the time between polls (2 s by default); Timeout bounds each poll, connect included.
	Refresh time.Duration
	Timeout time.Duration
	// Headers are sent with every poll.
	Headers map[string]string
	// MaxBodySize caps the body read (64 KiB by default); a larger body is a failed poll.
	MaxBodySize int
	// Dial, when set, makes the poll's connections (the gateway's egress-policy dialer). Connections are
	// then not kept between polls: every refresh is dialled, and checked, again.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Validate reports every problem of c at once.
func (c *LMCacheConfig) Validate() error {
	var errs []error
	if _, _, err := parseEndpoint(c.URL); err != nil {
		errs = append(errs, err)
	}
	errs = appendNegativeError(errs, "refresh", c.Refresh)
	errs = appendNegativeError(errs, "timeout", c.Timeout)
	errs = appendNegativeError(errs, "max body size", c.MaxBodySize)
	return errors.Join(errs...)
}

// LMCachePoller polls one LMCache status endpoint every refresh interval and stores the result in a
// CacheStatus. A failed poll (egress denied, connect error, timeout, non-200 status, body too large,
// invalid JSON, occupancy out of range, missing field) invalidates the CacheStatus at once.
//
// Start and Stop are safe for concurrent use; an LMCachePoller runs at most once.
type LMCachePoller struct {
	p      *poller
	status *CacheStatus
	jp     fastjson.Parser // used only by the poll goroutine
}

// NewLMCachePoller returns a poller for cfg writing to status. A nil logger means slog.Default(). An
// invalid cfg makes every poll fail with the LMCacheConfig.Validate error.
func NewLMCachePoller(cfg LMCacheConfig, status *CacheStatus, logger *slog.Logger) *LMCachePoller {
	lp := &LMCachePoller{status: status}
	lp.p = newPoller(pollerConfig{
		what:       "lmcache poll",
		url:        cfg.URL,
		cfgErr:     cfg.Validate(),
		accept:     "application/json",
		interval:   orDefault(cfg.Refresh, DefaultLMCacheRefresh),
		timeout:    orDefault(cfg.Timeout, DefaultPollTimeout),
		maxBody:    orDefault(cfg.MaxBodySize, DefaultLMCacheMaxBody),
		headers:    cfg.Headers,
		dialer:     cfg.Dial,
		handle:     lp.handle,
		invalidate: status.Invalidate,
		logger:     logger,
	})
	return lp
}

func (lp *LMCachePoller) handle(body []byte) error {
	occ, avail, err := ParseCacheStatus(&lp.jp, body)
	if err != nil {
		return fmt.Errorf("cannot read LMCache status from %q: %w", lp.p.url, err)
	}
	lp.status.Store(occ, avail, time.Now().UnixNano())
	return nil
}

// Start starts the poll goroutine; the first poll happens at once.
func (lp *LMCachePoller) Start() { lp.p.start() }

// Stop stops the poll goroutine and waits for it, aborting a poll in flight. The CacheStatus keeps
// its last values.
func (lp *LMCachePoller) Stop() { lp.p.stop() }

// Stats returns the poll counters. Safe for concurrent use.
func (lp *LMCachePoller) Stats() PollStats { return lp.p.stats() }
