package config

import (
	"fmt"
	"maps"
	"slices"
	"sort"
)

// Limits are rate limits of a data-plane key or an org: requests per minute, tokens per minute (prompt and
// completion) and requests in flight, each 0 for none, and optionally the same per public model, which
// apply within the key's or org's own (docs/configuration/limits.md).
type Limits struct {
	RPM        int64 `toml:"rpm" json:"rpm,omitempty"`
	TPM        int64 `toml:"tpm" json:"tpm,omitempty"`
	Concurrent int64 `toml:"concurrent" json:"concurrent,omitempty"`
	// Models are limits for a public model's requests, by its name.
	Models map[string]ModelLimits `toml:"models" json:"models,omitempty"`
}

// ModelLimits are the limits of one model's requests.
type ModelLimits struct {
	RPM        int64 `toml:"rpm" json:"rpm,omitempty"`
	TPM        int64 `toml:"tpm" json:"tpm,omitempty"`
	Concurrent int64 `toml:"concurrent" json:"concurrent,omitempty"`
}

// LimitsConfig is [limits]: the limits an org and each of its keys get where the control plane sets none,
// and how a request's token cost is reserved before its answer tells the real one.
type LimitsConfig struct {
	// Org applies to every org without limits of its own; Key to every key without its own or its org's
	// key default.
	Org Limits `toml:"org" json:"org"`
	Key Limits `toml:"key" json:"key"`
	// DefaultMaxTokens is the completion tokens a request that does not say max_tokens (or
	// max_completion_tokens) reserves.
	DefaultMaxTokens *int64 `toml:"default_max_tokens" json:"default_max_tokens,omitempty"`
}

// Bounds of limits.
const (
	// MaxLimit bounds every limit: a trillion requests or tokens a minute is no limit a fleet reaches.
	MaxLimit = 1 << 40
	// MaxLimitModels bounds the per-model limits of one key or org.
	MaxLimitModels = 256
	// DefaultMaxTokensReserved is [limits] default_max_tokens when unset.
	DefaultMaxTokensReserved = 1024
)

// Zero reports whether l limits nothing.
func (l *Limits) Zero() bool {
	return l.RPM == 0 && l.TPM == 0 && l.Concurrent == 0 && len(l.Models) == 0
}

// Check returns the problems of l as messages about its keys, prefixed by key ("limits.org", "keys[k]").
func (l *Limits) Check(key string) []string {
	var out []string
	one := func(k string, v int64) {
		if v < 0 || v > MaxLimit {
			out = append(out, fmt.Sprintf("%s.%s: %d is not between 0 (no limit) and %d", key, k, v, int64(MaxLimit)))
		}
	}
	one("rpm", l.RPM)
	one("tpm", l.TPM)
	one("concurrent", l.Concurrent)
	if len(l.Models) > MaxLimitModels {
		out = append(out, fmt.Sprintf("%s.models: %d models, at most %d", key, len(l.Models), MaxLimitModels))
		return out
	}
	names := make([]string, 0, len(l.Models))
	for m := range l.Models {
		names = append(names, m)
	}
	sort.Strings(names)
	for _, m := range names {
		ml := l.Models[m]
		mk := fmt.Sprintf("%s.models.%q", key, m)
		if m == "" || len(m) > MaxAdapterName {
			out = append(out, fmt.Sprintf("%s: a model name of 1 to %d bytes", mk, MaxAdapterName))
			continue
		}
		for k, v := range map[string]int64{"rpm": ml.RPM, "tpm": ml.TPM, "concurrent": ml.Concurrent} {
			if v < 0 || v > MaxLimit {
				out = append(out, fmt.Sprintf("%s.%s: %d is not between 0 (no limit) and %d", mk, k, v, int64(MaxLimit)))
			}
		}
	}
	sort.Strings(out)
	return out
}

// limits checks [limits], and the limits the control plane set on keys and orgs (it checked them already;
// the data plane does not take them on trust).
func (v *validator) limits(cfg *Config) {
	l := &cfg.Limits
	for i := range cfg.Keys {
		if k := cfg.Keys[i].Limits; k != nil {
			for _, msg := range k.Check(fmt.Sprintf("keys[%s].limits", cfg.Keys[i].ID)) {
				v.addf("keys", "%s", msg)
			}
		}
	}
	for _, org := range slices.Sorted(maps.Keys(cfg.OrgLimits)) {
		ol := cfg.OrgLimits[org]
		for name, lim := range map[string]*Limits{"limits": ol.Org, "key_limits": ol.Keys} {
			if lim != nil {
				for _, msg := range lim.Check(fmt.Sprintf("orgs[%s].%s", org, name)) {
					v.addf("orgs", "%s", msg)
				}
			}
		}
	}
	for _, msg := range l.Org.Check("limits.org") {
		v.addf("limits.org", "%s", msg)
	}
	for _, msg := range l.Key.Check("limits.key") {
		v.addf("limits.key", "%s", msg)
	}
	if n := l.DefaultMaxTokens; n != nil && (*n < 1 || *n > MaxLimit) {
		v.addf("limits.default_max_tokens", "%d is not between 1 and %d", *n, int64(MaxLimit))
	}
}
