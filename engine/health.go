package engine

import (
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/telemetry"
)

// Target states behind eligibility (docs/architecture.md, "Eligibility"): Eligible = healthy AND not cooling
// down AND circuit not open. All three are per provider (one engine), flat atomics read on every request;
// transitions happen on the failure path or in the health checker and are logged and counted.
//
// Cooldown (passive): connect errors, resets, timeouts, 502/503/504 and 429s count as failures;
// cooldown.failures of them within cooldown.window_secs cool the provider for base_secs, doubling (up to
// max_secs) each time it fails again before a success; a 429 with retry-after cools it for that long (capped
// at max_retry_after_secs). A success ends the escalation. Other 5xx answers (a 500 above all) come from an
// engine that is up and answered, often about one request it cannot serve - which a client can send to
// every replica in turn - so they count only as a run: cooldown.consecutive_5xx of them with no success
// between make one failure.
//
// Breaker: closed -> open after breaker.failures consecutive failures -> half-open after open_secs, letting
// half_open_probes requests through -> closed on a success, open again on a failure.
//
// Cooldowns and breakers never take more than health.max_ejection_percent of the providers out at once
// (at least one may always go; Envoy's max_ejection_percent): a failure that would eject one more is
// counted but ejects nothing. Active health checks are not capped.
//
// Health (active, off by default): one prober goroutine per provider (healthChecker, provider.go), at most
// one probe in flight.

// breaker states, also the rolter_breaker_state gauge values.
const (
	breakerClosed int32 = iota
	breakerHalfOpen
	breakerOpen
)

var breakerNames = [...]string{"closed", "half_open", "open"}

// providerHealth is the eligibility state of one provider.
type providerHealth struct {
	name string
	log  *slog.Logger
	cd   config.CooldownConfig
	br   config.BreakerConfig

	_         [64]byte
	down      atomic.Bool  // marked down by active health checks
	coolUntil atomic.Int64 // unix nanos; cooling while now < coolUntil
	brState   atomic.Int32
	brUntil   atomic.Int64 // unix nanos when an open breaker may go half-open
	brProbes  atomic.Int32 // half-open probes in flight
	_         [40]byte

	consecFail atomic.Int32 // consecutive failures, for the breaker
	consec5xx  atomic.Int32 // consecutive failAnswered answers not yet counted as a failure
	coolLevel  atomic.Int32 // cooldowns since the last success

	mu        sync.Mutex // failure path only
	failTimes []int64    // recent failure times, for the cooldown window

	fleet  atomic.Pointer[fleetHealth] // the providers that share the ejection cap: the live snapshot's
	states *telemetryStates
	// onRecover is called when active checks mark the target healthy again: its cache is presumed empty.
	onRecover func()
}

// fleetHealth is every provider of a snapshot, for the ejection cap.
type fleetHealth struct {
	maxPercent float64
	mu         sync.Mutex // held while one provider decides to eject itself
	members    []*providerHealth
}

// ejected reports whether h is out of service by its own passive state at now.
func (h *providerHealth) ejected(now int64) bool {
	if now < h.coolUntil.Load() {
		return true
	}
	switch h.brState.Load() {
	case breakerOpen:
		return now < h.brUntil.Load()
	case breakerHalfOpen:
		return true
	}
	return false
}

// mayEject reports whether one more provider may be ejected at now; it must be called with f.mu held.
func (f *fleetHealth) mayEject(now int64) bool {
	if f == nil {
		return true
	}
	limit := max(1, int(f.maxPercent*float64(len(f.members))/100))
	n := 0
	for _, m := range f.members {
		if m.ejected(now) {
			n++
		}
	}
	return n < limit
}

// telemetryStates counts state changes by name.
type telemetryStates struct {
	set    *metrics.Set
	target string
	mu     sync.Mutex
	c      map[string]*metrics.Counter
}

func (s *telemetryStates) inc(state string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	c := s.c[state]
	if c == nil {
		c = s.set.GetOrCreateCounter(telemetry.TargetStates + "{target=" + telemetry.Label(s.target) + ",state=" + telemetry.Label(state) + "}")
		s.c[state] = c
	}
	s.mu.Unlock()
	c.Inc()
}

func newProviderHealth(name string, cfg *config.Config, log *slog.Logger, set *telemetry.Set) *providerHealth {
	h := &providerHealth{name: name, log: log, cd: cfg.Cooldown, br: cfg.Breaker}
	if set != nil {
		h.states = &telemetryStates{set: set.Inner(), target: name, c: map[string]*metrics.Counter{}}
		l := "target=" + telemetry.Label(name)
		set.Gauge(telemetry.TargetEligible, l, func() float64 {
			if h.eligible(time.Now().UnixNano()) {
				return 1
			}
			return 0
		})
		set.Gauge(telemetry.CooldownRemaining, l, func() float64 {
			return max(0, float64(h.coolUntil.Load()-time.Now().UnixNano())/1e9)
		})
		set.Gauge(telemetry.BreakerState, l, func() float64 { return float64(h.brState.Load()) })
	}
	return h
}

// eligible reports whether the provider may take new requests at now (unix nanos). It does not change
// state; an open breaker whose time is up counts as eligible (the attempt itself moves it to half-open).
func (h *providerHealth) eligible(now int64) bool {
	if h.down.Load() || now < h.coolUntil.Load() {
		return false
	}
	switch h.brState.Load() {
	case breakerOpen:
		return now >= h.brUntil.Load()
	case breakerHalfOpen:
		return h.brProbes.Load() < int32(h.br.HalfOpenProbes)
	}
	return true
}

// admit is called when an attempt is about to use the provider. It returns false when the breaker does not
// let the request through (another request took the last half-open probe slot). probe is true when the
// request is a half-open probe, to be passed back to done.
func (h *providerHealth) admit(now int64) (ok, probe bool) {
	if !h.br.Enabled {
		return true, false
	}
	for {
		switch h.brState.Load() {
		case breakerClosed:
			return true, false
		case breakerOpen:
			if now < h.brUntil.Load() {
				return false, false
			}
			if h.brState.CompareAndSwap(breakerOpen, breakerHalfOpen) {
				h.transition("half_open", "breaker open_secs elapsed")
			}
		case breakerHalfOpen:
			n := h.brProbes.Load()
			if n >= int32(h.br.HalfOpenProbes) {
				return false, false
			}
			if h.brProbes.CompareAndSwap(n, n+1) {
				return true, true
			}
		}
	}
}

// success records a successful attempt (response headers with a non-failure status). It is on every
// request's path, so it only loads shared words unless there is something to reset.
func (h *providerHealth) success(probe bool) {
	if probe {
		h.brProbes.Add(-1)
	}
	if h.consecFail.Load() != 0 {
		h.consecFail.Store(0)
	}
	if h.coolLevel.Load() != 0 {
		h.coolLevel.Store(0)
	}
	if h.consec5xx.Load() != 0 {
		h.consec5xx.Store(0)
	}
	if h.brState.Load() != breakerClosed && h.brState.Swap(breakerClosed) != breakerClosed {
		h.transition("closed", "a request succeeded")
	}
}

// failure records a failed attempt. retryAfter > 0 is a 429's retry-after.
func (h *providerHealth) failure(now int64, probe bool, kind failKind, retryAfter time.Duration) {
	if probe {
		h.brProbes.Add(-1)
	}
	if kind == failAnswered {
		if n := h.consec5xx.Add(1); n < int32(h.cd.Consecutive5xx) {
			return
		}
		h.consec5xx.Store(0)
	}
	fleet := h.fleet.Load()
	if fleet != nil {
		// One provider at a time decides, so two failing at once cannot both slip under the cap.
		fleet.mu.Lock()
		defer fleet.mu.Unlock()
	}
	// A provider already out (cooling, or its breaker half-open) may stay out; a new ejection is capped.
	mayEject := h.ejected(now) || fleet.mayEject(now)
	consec := h.consecFail.Add(1)
	var cool time.Duration
	reason := ""
	if h.cd.Enabled {
		h.mu.Lock()
		switch level := h.coolLevel.Load(); {
		case retryAfter > 0:
			cool = min(retryAfter, secs(h.cd.MaxRetryAfterSecs))
			reason = "429 with retry-after"
		case level > 0 && now >= h.coolUntil.Load():
			// It failed again after a cooldown ended, before any success: escalate.
			cool = h.cooldownFor(int(level))
			h.coolLevel.Store(level + 1)
			reason = "failed again after a cooldown: " + kind.String()
		case level == 0:
			window := int64(secs(h.cd.WindowSecs))
			kept := h.failTimes[:0]
			for _, t := range h.failTimes {
				if now-t < window {
					kept = append(kept, t)
				}
			}
			h.failTimes = append(kept, now)
			if len(h.failTimes) >= h.cd.Failures {
				cool = h.cooldownFor(0)
				h.coolLevel.Store(1)
				h.failTimes = h.failTimes[:0]
				reason = strconv.Itoa(h.cd.Failures) + " failures within window_secs, last: " + kind.String()
			}
		}
		h.mu.Unlock()
	}
	if cool > 0 && !mayEject {
		h.states.inc("ejection_capped")
		h.log.Warn("target not cooled down: health.max_ejection_percent of the providers are out already",
			"target", h.name, "reason", reason)
		cool = 0
	}
	if cool > 0 {
		until := now + int64(cool)
		if until > h.coolUntil.Load() {
			h.coolUntil.Store(until)
			h.states.inc("cooldown")
			h.log.Warn("target cooling down", "target", h.name, "for", cool.String(), "reason", reason)
		}
	}
	if h.br.Enabled {
		st := h.brState.Load()
		if st == breakerHalfOpen || (st == breakerClosed && int(consec) >= h.br.Failures && mayEject) {
			if h.brState.CompareAndSwap(st, breakerOpen) {
				h.brUntil.Store(now + int64(secs(h.br.OpenSecs)))
				why := strconv.Itoa(int(consec)) + " consecutive failures, last: " + kind.String()
				if st == breakerHalfOpen {
					why = "half-open probe failed: " + kind.String()
				}
				h.transition("open", why)
			}
		}
	}
}

func (h *providerHealth) cooldownFor(level int) time.Duration {
	d := secs(h.cd.BaseSecs) << min(level, 20)
	return min(d, secs(h.cd.MaxSecs))
}

func (h *providerHealth) transition(state, reason string) {
	h.states.inc("breaker_" + state)
	h.log.Warn("target breaker "+state, "target", h.name, "reason", reason)
}

// setDown records the result of active health checks.
func (h *providerHealth) setDown(down bool, reason string) {
	if h.down.Swap(down) == down {
		return
	}
	if down {
		h.states.inc("unhealthy")
		h.log.Warn("target marked unhealthy", "target", h.name, "reason", reason)
	} else {
		h.states.inc("healthy")
		h.log.Info("target marked healthy", "target", h.name, "reason", reason)
		if h.onRecover != nil {
			h.onRecover()
		}
	}
}

// status says whether the provider is eligible at now and, when not, why.
func (h *providerHealth) status(now int64) (eligible bool, why string) {
	switch {
	case h.down.Load():
		return false, "unhealthy"
	case now < h.coolUntil.Load():
		return false, "cooling down"
	}
	switch h.brState.Load() {
	case breakerOpen:
		if now < h.brUntil.Load() {
			return false, "breaker open"
		}
	case breakerHalfOpen:
		if !h.eligible(now) {
			return false, "breaker half-open"
		}
	}
	return true, ""
}

// badness orders ineligible providers for fail-open: lower is less bad.
func (h *providerHealth) badness(now int64) int64 {
	var b int64
	if h.down.Load() {
		b += 1 << 50
	}
	if h.brState.Load() == breakerOpen {
		b += max(0, h.brUntil.Load()-now)
	}
	b += max(0, h.coolUntil.Load()-now)
	return b
}
