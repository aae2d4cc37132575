package config

import (
	"fmt"
	"slices"
)

// disaggregation checks [routes.disaggregation] of route i (r, at key): a known protocol, a decode pool of
// valid targets none of which is also a prefill target, and parameters in range.
func (v *validator) disaggregation(key string, i int, r *RouteConfig, ps []ProviderConfig, byName map[string]int) {
	d := r.Disaggregation
	dk := key + ".disaggregation"
	switch d.Protocol {
	case ProtocolVLLM, ProtocolSGLang:
	default:
		v.addf(dk+".protocol", "unknown protocol %q; want %q or %q", d.Protocol, ProtocolVLLM, ProtocolSGLang)
	}
	if r.Org != "" {
		v.addf(dk, "an org's route cannot be disaggregated")
	}
	if len(d.Decode) == 0 && len(d.DecodeDiscovered) == 0 {
		v.addf(dk+".decode", "route %q has no decode targets", r.Model)
	}
	if len(d.Decode) > MaxTargets {
		v.addf(dk+".decode", "route %q has %d decode targets; at most %d are supported", r.Model, len(d.Decode), MaxTargets)
	}
	v.pool(dk+".decode", i, r, d.Decode, true, ps, byName)
	for j, t := range d.Decode {
		if t.Provider != "" && slices.ContainsFunc(r.Targets, func(o TargetConfig) bool { return o.Provider == t.Provider }) {
			// One engine in both pools would be paired with itself; an engine of role "both" serves two
			// routes, or one through two providers.
			v.addf(fmt.Sprintf("%s.decode[%d].provider", dk, j), "provider %q is also a prefill target of route %q", t.Provider, r.Model)
		}
		if t.Source != "" && slices.ContainsFunc(r.Targets, func(o TargetConfig) bool { return o.Source == t.Source }) {
			v.addf(fmt.Sprintf("%s.decode[%d].source", dk, j), "source %q also gives route %q its prefill targets", t.Source, r.Model)
		}
	}
	if n := *d.PrefillThresholdTokens; n < 0 {
		v.addf(dk+".prefill_threshold_tokens", "prefill_threshold_tokens must be >= 0, got %d", n)
	}
	if d.BootstrapPort != nil {
		if d.Protocol != ProtocolSGLang {
			v.addf(dk+".bootstrap_port", "bootstrap_port is a parameter of protocol %q only", ProtocolSGLang)
		} else if p := *d.BootstrapPort; p < 0 || p > 65535 {
			v.addf(dk+".bootstrap_port", "bootstrap_port must be in 0..65535, got %d", p)
		}
	}
}
