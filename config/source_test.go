package config

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/kvindex"
)

const sourceBase = `
[[sources]]
name = "pool"
kind = "kubernetes"
[sources.kubernetes]
service = "vllm"
[sources.provider]
api_base = "http://{ip}:{port}/v1"
[sources.provider.lmcache]
endpoint = "http://{ip}:8100/lmcache/status"
[[routes]]
model = "m"
strategy = "cache_aware"
[[routes.targets]]
source = "pool"
model = "llama"
`

// kvSourceBase is sourceBase routing on KV events, which a build without cgo refuses.
var kvSourceBase = strings.NewReplacer(`strategy = "cache_aware"`, `strategy = "precise_cache_aware"`,
	"[sources.provider.lmcache]\nendpoint = \"http://{ip}:8100/lmcache/status\"\n", "[sources.provider.kv_events]\nendpoint = \"tcp://{ip}:5557\"\n").Replace(sourceBase)

// TestSourceValidation: every rule of [[sources]] and of targets that name one, each under its key.
func TestSourceValidation(t *testing.T) {
	f := func(src, want string) {
		t.Helper()
		cfg, err := Parse([]byte(src), "s.toml")
		if want == "" {
			if err != nil {
				t.Fatalf("unexpected error: %s\n%s", err, src)
			}
			s := cfg.Sources[0]
			if s.SettleSecs != defaultSettleSecs || s.MaxEndpoints != MaxTargets || s.Provider.MaxConns != defaultProviderMaxConns {
				t.Fatalf("defaults not set: %+v", s)
			}
			return
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("got %v, want %q\n%s", err, want, src)
		}
	}
	f(sourceBase, "")
	f(strings.Replace(sourceBase, `service = "vllm"`, `service = "vllm"`+"\nselector = \"app=vllm\"", 1),
		"sources[0].kubernetes: set exactly one of service, selector and inference_pool, got 2")
	f(strings.Replace(sourceBase, `service = "vllm"`, `selector = "app=vllm"`, 1), "sources[0].port: a source of pods by selector needs the engines' port")
	f(strings.Replace(sourceBase, `kind = "kubernetes"`, `kind = "consul"`, 1), `sources[0].kind: unknown source kind "consul"`)
	f(strings.Replace(sourceBase, `name = "pool"`, `name = "a/b"`, 1), `sources[0].name: source name "a/b" may not hold`)
	f(strings.Replace(sourceBase, `http://{ip}:{port}/v1`, `http://10.0.0.1:8000/v1`, 1), "sources[0].provider.api_base: a source's api_base must hold {ip}")
	f(strings.Replace(sourceBase, `http://{ip}:{port}/v1`, `ftp://{ip}/v1`, 1), "sources[0].provider.api_base: URL")

	f(strings.Replace(sourceBase, `source = "pool"`, `source = "other"`, 1), `routes[0].targets[0].source: unknown source "other"`)
	f(strings.Replace(sourceBase, `source = "pool"`, "source = \"pool\"\nprovider = \"p\"", 1), "routes[0].targets[0].source: set provider or source, not both")
	f(sourceBase+"[[routes.targets]]\nsource = \"pool\"\n", `routes[0].targets[1].source: source "pool" is already a target of routes[0]`)
	f(strings.Replace(sourceBase, `strategy = "cache_aware"`, `strategy = "precise_cache_aware"`, 1),
		`routes[0].targets[0].source: the route's strategies need KV events: source "pool" needs [sources.provider.kv_events]`)
	if kvindex.Supported {
		f(kvSourceBase, "")
		f(strings.Replace(kvSourceBase, `endpoint = "tcp://{ip}:5557"`, "endpoint = \"tcp://{ip}:5557\"\nmode = \"bind\"", 1), "sources[0].provider.kv_events.mode")
	}
	f(sourceBase+"[[providers]]\nname = \"pool@10.0.0.1:8000\"\napi_base = \"http://10.0.0.1:8000\"\n", `provider name "pool@10.0.0.1:8000" is taken by source "pool"`)
	dns := strings.Replace(sourceBase, "kind = \"kubernetes\"\n[sources.kubernetes]\nservice = \"vllm\"", "kind = \"dns\"\n[sources.dns]\nname = \"vllm.local\"\nrecord = \"a\"", 1)
	f(dns, "sources[0].port: A and AAAA records carry no port")
	f(strings.Replace(dns, `record = "a"`, `record = "srv"`, 1), "")
	f(strings.Replace(dns, `record = "a"`, `record = "mx"`, 1), `sources[0].dns.record: unknown record "mx"`)
	f(strings.Replace(dns, `record = "a"`, "record = \"srv\"\nmin_ttl_secs = 40", 1), "sources[0].dns.min_ttl_secs: min_ttl_secs (40) is above max_ttl_secs (30)")
	f(strings.Replace(dns, `record = "a"`, "record = \"srv\"\nresolver = \"10.0.0.1\"", 1), `sources[0].dns.resolver: resolver must be host:port`)
	f(strings.Replace(dns, "[sources.dns]\nname = \"vllm.local\"\nrecord = \"a\"", "", 1), "sources[0].dns: a dns source needs [sources.dns]")
}

// TestProviderFor: the template is filled with the endpoint's address (IPv6 in brackets), and a pod's
// annotations replace the template's endpoints.
func TestProviderFor(t *testing.T) {
	cfg, err := Parse([]byte(sourceBase), "s.toml")
	if err != nil {
		t.Fatal(err)
	}
	s := &cfg.Sources[0]
	// The KV events' template, which a build without cgo would refuse in a file.
	s.Provider.KVEvents = &KVEventsConfig{Endpoint: "tcp://{ip}:5557"}
	p := s.ProviderFor("x", netip.MustParseAddrPort("[fd00::5]:8000"), "", "")
	if p.Name != "x" || p.Source != "pool" || p.APIBase != "http://[fd00::5]:8000/v1" || p.KVEvents.Endpoint != "tcp://[fd00::5]:5557" ||
		p.LMCache.Endpoint != "http://[fd00::5]:8100/lmcache/status" {
		t.Fatalf("got %+v %+v", p, p.KVEvents)
	}
	p = s.ProviderFor("x", netip.MustParseAddrPort("10.1.2.3:9000"), "tcp://10.9.9.9:7000", "http://10.9.9.9:1/s")
	if p.APIBase != "http://10.1.2.3:9000/v1" || p.KVEvents.Endpoint != "tcp://10.9.9.9:7000" || p.LMCache.Endpoint != "http://10.9.9.9:1/s" {
		t.Fatalf("got %+v %+v", p, p.KVEvents)
	}
	if s.Provider.KVEvents.Endpoint != "tcp://{ip}:5557" || s.Provider.LMCache.Endpoint != "http://{ip}:8100/lmcache/status" {
		t.Fatal("the template was changed")
	}
	if got := EndpointName("pool", netip.MustParseAddrPort("10.1.2.3:9000"), "3f2a9c1b-aaaa-bbbb"); got != "pool@10.1.2.3:9000/3f2a9c1b" {
		t.Fatal(got)
	}
}
