package engine

import (
	"log/slog"
	"slices"
	"time"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/egress"
	"github.com/rolter-ai/rolter/telemetry"
)

// residency is a provider's view of its engine's LoRA adapters: what its /metrics scrape reads of
// vllm:lora_requests_info and its /v1/models poll lists (telemetry.Adapters), under the scrape's staleness
// rule - a view older than maxAge is unknown, never leaned on.
type residency struct {
	a      *telemetry.Adapters
	maxAge int64
	models *telemetry.ModelsPoller
}

// running reports whether the engine reports requests of adapter name running (false when unknown).
func (r *residency) running(name string, now int64) bool { return r.a.Running(name, now, r.maxAge) }

// slots returns the engine's adapter slots (max_lora), when it reports them.
func (r *residency) slots(now int64) (int, bool) { return r.a.MaxLoRA(now, r.maxAge) }

// serves reports whether the engine can serve adapter name: it lists it, or its list is unknown.
func (r *residency) serves(name string, now int64) bool {
	known, listed, _ := r.listed(name, now)
	return !known || listed
}

// listed reports whether the engine's list of adapters is known and has name, and when that list was read.
func (r *residency) listed(name string, now int64) (known, listed bool, at int64) {
	at, ok := r.a.ModelsAt(now, r.maxAge)
	if !ok {
		return false, false, 0
	}
	return true, r.a.Registered(name, now, r.maxAge), at
}

// state is the residency for the state view.
func (r *residency) state(now int64) *AdapterState {
	v := r.a.View(now, r.maxAge)
	st := &AdapterState{}
	if v.ModelsKnown {
		st.Registered = v.Registered
	}
	if v.BatchKnown {
		st.Running, st.Waiting = v.Running, v.Waiting
		n := v.MaxLoRA
		st.MaxLoRA = &n
	}
	return st
}

// servesAdapters reports whether a [routes.lora] route of cfg has provider name among its targets.
func servesAdapters(name string, cfg *config.Config) bool {
	for _, rc := range cfg.Routes {
		if rc.LoRA != nil && slices.ContainsFunc(rc.Targets, func(t config.TargetConfig) bool { return t.Provider == name }) {
			return true
		}
	}
	return false
}

// newResidency sets up p's adapter residency: the scrape sc reads vllm:lora_requests_info into it, and a
// poll of the engine's /v1/models, at the scrape's interval and through the same dialer, lists its
// adapters. It registers the engine's adapter series and returns what sc stores into.
func (p *Provider) newResidency(sc telemetry.ScrapeConfig, log *slog.Logger, dialer *egress.Dialer) *telemetry.Adapters {
	a := &telemetry.Adapters{}
	mc := telemetry.ModelsConfig{BaseURL: sc.BaseURL, Interval: sc.Interval, Timeout: sc.Timeout, Headers: sc.Headers, Dial: dialer.DialContext}
	r := &residency{a: a, maxAge: int64(3 * sc.Interval), models: telemetry.NewModelsPoller(mc, a, log.With("target", p.Name))}
	p.adapters = r
	l := "target=" + telemetry.Label(p.Name)
	count := func(f func(v telemetry.AdapterView) (int, bool)) func() float64 {
		return func() float64 {
			n, ok := f(a.View(time.Now().UnixNano(), r.maxAge))
			if !ok {
				return -1
			}
			return float64(n)
		}
	}
	p.set.Gauge(telemetry.EngineLoRA, l+`,state="running"`, count(func(v telemetry.AdapterView) (int, bool) { return len(v.Running), v.BatchKnown }))
	p.set.Gauge(telemetry.EngineLoRA, l+`,state="waiting"`, count(func(v telemetry.AdapterView) (int, bool) { return len(v.Waiting), v.BatchKnown }))
	p.set.Gauge(telemetry.EngineLoRA, l+`,state="registered"`, count(func(v telemetry.AdapterView) (int, bool) { return len(v.Registered), v.ModelsKnown }))
	p.set.Gauge(telemetry.EngineLoRASlots, l, count(func(v telemetry.AdapterView) (int, bool) { return v.MaxLoRA, v.BatchKnown }))
	return a
}
