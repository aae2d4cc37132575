package config

import (
	"strings"
	"testing"
)

// TestLimitsValidation: [limits] and the control plane's key and org limits take 0 (none) to 2^40, model
// names of 1 to 256 bytes, and a default_max_tokens of at least 1; every problem names its field.
func TestLimitsValidation(t *testing.T) {
	base := gatewayConfig("round_robin", "", "http://127.0.0.1:1")
	f := func(extra string, mutate func(*Config), want ...string) {
		t.Helper()
		var got string
		cfg, err := Parse([]byte(base+extra), "t.toml")
		switch {
		case err != nil:
			got = err.Error()
		case mutate != nil:
			mutate(cfg)
			if errs := Validate(cfg); len(errs) > 0 {
				got = errs.Error()
			}
		}
		if len(want) == 0 {
			if got != "" {
				t.Fatalf("%q: %s", extra, got)
			}
			return
		}
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Fatalf("%q: %s, want %q", extra, got, w)
			}
		}
	}
	f("[limits.key]\nrpm = 10\ntpm = 1000\nconcurrent = 4\n[limits.key.models.m]\ntpm = 5\n", nil)
	f("[limits.org]\nrpm = -1\n", nil, "limits.org.rpm: -1 is not between 0 (no limit) and 1099511627776")
	f("[limits.key]\ntpm = 1099511627777\n", nil, "limits.key.tpm")
	f("[limits]\ndefault_max_tokens = 0\n", nil, "limits.default_max_tokens: 0 is not between 1")
	f("[limits.key.models.\"\"]\nrpm = 1\n", nil, "a model name of 1 to 256 bytes")
	f("", func(c *Config) {
		c.Keys = []DataKey{{Org: "o", ID: "key_1", Limits: &Limits{Concurrent: -2}}}
		c.OrgLimits = map[string]OrgLimits{"o": {Keys: &Limits{Models: map[string]ModelLimits{"m": {RPM: -3}}}}}
	}, "keys[key_1].limits.concurrent: -2", `orgs[o].key_limits.models."m".rpm: -3`)
}
