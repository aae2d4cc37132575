package config

import (
	"strings"
	"testing"
)

const disaggBase = `
[[providers]]
name = "p"
api_base = "http://10.0.0.1:8000"
[[providers]]
name = "d"
api_base = "http://10.0.0.2:8000"
[[routes]]
model = "m"
strategy = "cache_aware"
[[routes.targets]]
provider = "p"
[routes.disaggregation]
[[routes.disaggregation.decode]]
provider = "d"
`

// TestDisaggregationValidation: the defaults of [routes.disaggregation] and every rule, each under its key.
func TestDisaggregationValidation(t *testing.T) {
	cfg, err := Parse([]byte(disaggBase), "d.toml")
	if err != nil {
		t.Fatal(err)
	}
	d := cfg.Routes[0].Disaggregation
	if d.Protocol != ProtocolVLLM || *d.PrefillThresholdTokens != DefaultPrefillThresholdTokens || d.BootstrapPort != nil ||
		d.Decode[0].Model != "m" || *d.Decode[0].Weight != 1 {
		t.Fatalf("defaults not set: %+v %+v", d, d.Decode)
	}
	sg, err := Parse([]byte(strings.Replace(disaggBase, "[routes.disaggregation]\n", "[routes.disaggregation]\nprotocol = \"sglang\"\n", 1)), "d.toml")
	if err != nil || *sg.Routes[0].Disaggregation.BootstrapPort != DefaultBootstrapPort {
		t.Fatalf("sglang defaults: %v %+v", err, sg)
	}
	f := func(src, want string) {
		t.Helper()
		_, err := Parse([]byte(src), "d.toml")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("got %v, want %q\n%s", err, want, src)
		}
	}
	r := func(old, new string) string { return strings.Replace(disaggBase, old, new, 1) }
	f(r("[routes.disaggregation]\n", "[routes.disaggregation]\nprotocol = \"nixl\"\n"), `routes[0].disaggregation.protocol: unknown protocol "nixl"`)
	f(r("[[routes.disaggregation.decode]]\nprovider = \"d\"\n", ""), `routes[0].disaggregation.decode: route "m" has no decode targets`)
	f(r("provider = \"d\"\n", "provider = \"x\"\n"), `routes[0].disaggregation.decode[0].provider: unknown provider "x"`)
	f(r("provider = \"d\"\n", "provider = \"p\"\n"), `routes[0].disaggregation.decode[0].provider: provider "p" is also a prefill target of route "m"`)
	f(disaggBase+"[[routes.disaggregation.decode]]\nprovider = \"d\"\n", `routes[0].disaggregation.decode[1].provider: provider "d" is already routes[0].disaggregation.decode[0]`)
	f(disaggBase+"weight = 0\n", "routes[0].disaggregation.decode[0].weight: weight must be > 0")
	f(r("[routes.disaggregation]\n", "[routes.disaggregation]\nprefill_threshold_tokens = -1\n"), "routes[0].disaggregation.prefill_threshold_tokens: prefill_threshold_tokens must be >= 0")
	f(r("[routes.disaggregation]\n", "[routes.disaggregation]\nbootstrap_port = 8998\n"), `routes[0].disaggregation.bootstrap_port: bootstrap_port is a parameter of protocol "sglang" only`)
	f(r("[routes.disaggregation]\n", "[routes.disaggregation]\nprotocol = \"sglang\"\nbootstrap_port = 70000\n"), "routes[0].disaggregation.bootstrap_port: bootstrap_port must be in 0..65535")
	f(r("[[routes.disaggregation.decode]]\nprovider = \"d\"\n", "[[routes.disaggregation.decode]]\nsource = \"nope\"\n"), `routes[0].disaggregation.decode[0].source: unknown source "nope"`)
}
