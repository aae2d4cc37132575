//go:build cgo

package engine

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/internal/freeport"
)

// diffPorts are the loopback ports of the differential test's KV-event endpoints: the base config's
// connect, replay and bind endpoints, and one alternative of each.
type diffPorts struct{ connect, replay, bind, connect2, replay2, bind2 int }

func newDiffPorts(t *testing.T) diffPorts {
	t.Helper()
	var ps [6]int
	for i := range ps {
		for {
			p, err := freeport.Loopback()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(ps[:i], p) {
				ps[i] = p
				break
			}
		}
	}
	return diffPorts{ps[0], ps[1], ps[2], ps[3], ps[4], ps[5]}
}

// curveKeys are the differential test's CURVE keys: the gateway's pair and a publisher's public key, the
// same for every config it makes, so that two gateways' descriptions can be compared.
type curveKeys struct{ public, secret, client string }

var diffCurve struct {
	once sync.Once
	keys curveKeys
	err  error
}

func diffCurveKeys(t *testing.T) curveKeys {
	t.Helper()
	diffCurve.once.Do(func() {
		k := &diffCurve.keys
		if k.public, k.secret, diffCurve.err = zmq.NewCurveKeypair(); diffCurve.err == nil {
			k.client, _, diffCurve.err = zmq.NewCurveKeypair()
		}
	})
	if diffCurve.err != nil {
		t.Fatal(diffCurve.err)
	}
	return diffCurve.keys
}

// rebound returns ps with bind ports of its own: two gateways of one comparison run side by side, and a
// bind on a port another gateway holds is refused. mapBinds writes the description of a gateway on ps's
// twin back in ps's ports.
func (ps diffPorts) rebound(t *testing.T) diffPorts {
	t.Helper()
	taken := []int{ps.connect, ps.replay, ps.bind, ps.connect2, ps.replay2, ps.bind2}
	for {
		// Ports apart from every port ps names, so that mapBinds maps only the binds.
		o := newDiffPorts(t)
		if !slices.Contains(taken, o.bind) && !slices.Contains(taken, o.bind2) {
			ps.bind, ps.bind2 = o.bind, o.bind2
			return ps
		}
	}
}

func (ps diffPorts) mapBinds(desc string, twin diffPorts) string {
	r := strings.NewReplacer(
		fmt.Sprintf("127.0.0.1:%d", twin.bind), fmt.Sprintf("127.0.0.1:%d", ps.bind),
		fmt.Sprintf("127.0.0.1:%d", twin.bind2), fmt.Sprintf("127.0.0.1:%d", ps.bind2))
	return r.Replace(desc)
}

// diffBase is the differential test's base config: every section set to a non-default value where it
// has one, every component present (health checks, scraper, LMCache poller, both KV-event modes, every
// strategy with parameters, a shadow, an org's route and key, the routing trace and the observers).
func diffBase(dir string, ps diffPorts) string {
	return fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
max_body_bytes = 1000000
max_header_bytes = 32768
max_body_memory_bytes = 100000000
max_conns = 500
max_conns_per_ip = 100
routing_memory_bytes = 100000000
read_timeout_secs = 30
write_timeout_secs = 30
idle_timeout_secs = 30
drain_secs = 5
expose_decision_headers = true
expose_metrics = true
cache_key_fields = ["user"]
session_headers = ["x-conv"]

[metrics_scrape]
enabled = true
interval_secs = 30
timeout_secs = 1
path = "/metrics"

[health]
enabled = true
path = "/health"
interval_secs = 30
timeout_secs = 1
unhealthy_threshold = 2
healthy_threshold = 2
fail_open = true
max_ejection_percent = 50

[queue]
max_inflight = 100
max_inflight_per_target = 10
max_waiting_per_target = 5

[egress]
allow_hosts = ["localhost"]
allow_cidrs = ["127.0.0.0/8"]
deny_hosts = ["evil.example"]
deny_cidrs = ["10.9.9.0/24"]

[docs]
base_url = "https://docs.example/"

[trace]
path = %[1]q

[log]
access = %[2]q

[tracing]
endpoint = "http://127.0.0.1:9/v1/traces"
headers = { X-Tenant = "t1" }

[[providers]]
name = "a"
api_base = "http://127.0.0.1:9/v1"
api_key_env = "ROLTER_DIFF_KEY"
headers = { X-Team = "t1" }
max_conns = 64
[providers.kv_events]
endpoint = "tcp://127.0.0.1:%[3]d"
topic = "kv@a"
replay_endpoint = "tcp://127.0.0.1:%[4]d"
max_blocks = 1000
stale_secs = 30
[providers.lmcache]
endpoint = "http://127.0.0.1:9/lmcache/status"
refresh_secs = 30
stale_secs = 60

[[providers]]
name = "b"
api_base = "http://127.0.0.1:10"
[providers.kv_events]
endpoint = "tcp://127.0.0.1:%[5]d"
mode = "bind"
topic = "kv@b"
allowed_publishers = ["127.0.0.1"]

[[providers]]
name = "d"
api_base = "http://127.0.0.1:12"

[[routes]]
model = "m"
strategy = "precise_cache_aware"
[routes.params]
threshold = 0.5
max_trie_nodes = 1000
max_trie_bytes = 100000
stale_gap = 0.4
stale_window = 50
home = true
[routes.shadow]
strategies = ["cache_aware"]
[[routes.targets]]
provider = "a"
model = "up-a"
[[routes.targets]]
provider = "b"
model = "up-b"

[[routes]]
model = "c"
strategy = "cache_aware"
[routes.params]
overload_margin = 2
overload_factor = 1.5
[[routes.targets]]
provider = "a"
[[routes.targets]]
provider = "b"

[[routes]]
model = "p"
strategy = "pipeline"
[routes.params]
weight_factor = 1
load_factor = 1
cache_factor = 1
session_ttl_secs = 60
max_sessions = 100
hot_window = 64
[[routes.targets]]
provider = "a"
weight = 1
[[routes.targets]]
provider = "b"
weight = 2

[[routes]]
model = "h"
strategy = "consistent_hash"
[routes.params]
epsilon = 0.25
virtual_nodes = 40
key_bytes = 256
[[routes.targets]]
provider = "a"
[[routes.targets]]
provider = "b"

[[routes]]
model = "pd"
strategy = "cache_aware"
[[routes.targets]]
provider = "a"
[routes.disaggregation]
protocol = "sglang"
bootstrap_port = 8998
prefill_threshold_tokens = 256
[[routes.disaggregation.decode]]
provider = "b"
model = "up-d"

[[routes]]
model = "l"
strategy = "least_load"
[[routes.targets]]
provider = "a"
model = "up-l"
[[routes.targets]]
provider = "b"
model = "up-l"
[routes.lora]
adapters = ["l-x", "l-y"]
home_replicas = 1
max_home_replicas = 2
replica_requests = 4
cool_secs = 10
max_loras = 2
dynamic_lora = true
adapter_path = "/loras/{adapter}"
load_timeout_secs = 20
`, filepath.Join(dir, "trace.jsonl"), filepath.Join(dir, "access.log"), ps.connect, ps.replay, ps.bind)
}

// diffConfig parses the base config and adds what the file cannot hold: an org's provider, route and
// data-plane key, as the control plane composes them.
func diffConfig(t *testing.T, dir string, ps diffPorts) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(diffBase(dir, ps)), "diff.toml")
	if err != nil {
		t.Fatalf("bad base config: %s", err)
	}
	cfg.Providers = append(cfg.Providers, config.ProviderConfig{Org: "org_1", Name: "org_1/o", APIBase: "http://127.0.0.1:11",
		APIKeySecret: "k", Secrets: map[string]string{"k": "org secret one", "k2": "org secret two"}})
	cfg.Routes = append(cfg.Routes, config.RouteConfig{Org: "org_1", Model: "org_1/r", Strategy: "round_robin",
		Targets: []config.TargetConfig{{Provider: "org_1/o"}}})
	cfg.KeyPepper = [32]byte{1}
	cfg.Keys = []config.DataKey{{Org: "org_1", Hash: sha256.Sum256([]byte("key one"))}}
	if errs := config.Validate(cfg); len(errs) > 0 {
		t.Fatalf("bad base config: %s", errs)
	}
	return cfg
}

// configPaths lists every field path of Config: TOML keys joined by dots, and the Go name of a field TOML
// does not hold. An array of tables and an optional table (behind a pointer) are a path themselves
// (adding an element, adding the table) and the parent of their fields' paths.
func configPaths() []string {
	var out []string
	var walk func(prefix string, t reflect.Type)
	walk = func(prefix string, t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			leaf := name == "-"
			if name == "" || name == "-" {
				name = f.Name
			}
			path := strings.TrimPrefix(prefix+"."+name, ".")
			ft := f.Type
			for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
				ft = ft.Elem()
			}
			if !leaf && ft.Kind() == reflect.Struct {
				if ft != f.Type {
					out = append(out, path)
				}
				walk(path, ft)
				continue
			}
			out = append(out, path)
		}
	}
	walk("", reflect.TypeFor[config.Config]())
	return out
}

// restartPaths need a restart: Reload refuses a change to them (restartOnly, [control], [cluster]).
func restartPath(path string) bool {
	switch path {
	case "server.listen", "server.max_header_bytes", "server.read_timeout_secs", "server.write_timeout_secs",
		"server.idle_timeout_secs", "server.max_conns", "server.max_conns_per_ip", "server.tls_cert_file",
		"server.tls_key_file", "server.tls_min_version":
		return true
	}
	if strings.HasPrefix(path, "control.quotas") {
		return false // read by the control plane at every write
	}
	return strings.HasPrefix(path, "control.") || strings.HasPrefix(path, "cluster.")
}

// invisible are the paths no runtime component is built from: a change there must describe the same.
var invisible = map[string]bool{
	"File": true, // error messages only
	// One kind exists: its alternative (unset) is the default again. A second kind would show in Built.
	"providers.kind": true,
	// The control plane checks the quotas when an org writes; the gateway builds nothing from them.
	"control.quotas.routing_memory_bytes": true, "control.quotas.routes": true, "control.quotas.providers": true,
	"control.quotas.targets_per_route": true, "control.quotas.targets": true, "control.quotas.keys": true,
	"control.quotas.tokens": true,
	// Which source found a provider, and which sources a route's targets came from: for validation and
	// the sources' status only.
	"providers.Source": true, "routes.Discovered": true,
}

// fleetPath reports the paths the discovery Fleet reads and the engine never sees: it expands [[sources]]
// and the targets that name one into providers and targets before a config reaches Reload (the discovery
// package's tests cover them).
func fleetPath(path string) bool {
	switch path {
	case "routes.targets.source", "routes.disaggregation.decode.source", "routes.disaggregation.DecodeDiscovered":
		return true
	}
	return path == "sources" || strings.HasPrefix(path, "sources.")
}

func route(cfg *config.Config, model string) *config.RouteConfig {
	for i := range cfg.Routes {
		if cfg.Routes[i].Model == model {
			return &cfg.Routes[i]
		}
	}
	panic("no route " + model)
}

func provider(cfg *config.Config, name string) *config.ProviderConfig {
	for i := range cfg.Providers {
		if cfg.Providers[i].Name == name {
			return &cfg.Providers[i]
		}
	}
	panic("no provider " + name)
}

// diffMutations are one valid alternative value for every field path (configPaths): the change the
// differential test reloads. A change some field needs alongside (CURVE's keys, say) goes with it.
func diffMutations(t *testing.T, dir string, ps diffPorts) map[string]func(*config.Config) {
	k := diffCurveKeys(t)
	curvePublic, curveSecret, clientPublic := k.public, k.secret, k.client
	t.Setenv("ROLTER_DIFF_KEY", "secret one")
	t.Setenv("ROLTER_DIFF_KEY2", "secret two")
	t.Setenv("ROLTER_DIFF_CURVE", curveSecret)
	t.Setenv("ROLTER_DIFF_SALT", "salt")
	a := func(c *config.Config) *config.ProviderConfig { return provider(c, "a") }
	b := func(c *config.Config) *config.ProviderConfig { return provider(c, "b") }
	// A key pair is named by two fields that go together: each one's mutation sets both.
	cert, key := writeTLSPair(t, dir)
	return map[string]func(*config.Config){
		"server.listen":                  func(c *config.Config) { c.Server.Listen = "127.0.0.1:1" },
		"server.tls_cert_file":           func(c *config.Config) { c.Server.TLSCertFile, c.Server.TLSKeyFile = cert, key },
		"server.tls_key_file":            func(c *config.Config) { c.Server.TLSCertFile, c.Server.TLSKeyFile = cert, key },
		"server.tls_min_version":         func(c *config.Config) { c.Server.TLSMinVersion = "1.3" },
		"server.max_body_bytes":          func(c *config.Config) { c.Server.MaxBodyBytes = 2000000 },
		"server.max_header_bytes":        func(c *config.Config) { c.Server.MaxHeaderBytes = 16384 },
		"server.max_body_memory_bytes":   func(c *config.Config) { c.Server.MaxBodyMemoryBytes = 200000000 },
		"server.max_conns":               func(c *config.Config) { c.Server.MaxConns = 600 },
		"server.max_conns_per_ip":        func(c *config.Config) { c.Server.MaxConnsPerIP = 50 },
		"server.routing_memory_bytes":    func(c *config.Config) { c.Server.RoutingMemoryBytes = 50000000 },
		"server.read_timeout_secs":       func(c *config.Config) { c.Server.ReadTimeoutSecs = 31 },
		"server.write_timeout_secs":      func(c *config.Config) { c.Server.WriteTimeoutSecs = 31 },
		"server.idle_timeout_secs":       func(c *config.Config) { c.Server.IdleTimeoutSecs = 31 },
		"server.drain_secs":              func(c *config.Config) { c.Server.DrainSecs = 6 },
		"server.expose_decision_headers": func(c *config.Config) { c.Server.ExposeDecisionHeaders = false },
		"server.expose_metrics":          func(c *config.Config) { c.Server.ExposeMetrics = false },
		"server.cache_key_fields":        func(c *config.Config) { c.Server.CacheKeyFields = []string{"user", "tenant"} },
		"server.session_headers":         func(c *config.Config) { c.Server.SessionHeaders = []string{"x-thread"} },

		"providers": func(c *config.Config) {
			c.Providers = append(c.Providers, config.ProviderConfig{Name: "e", APIBase: "http://127.0.0.1:13"})
		},
		"providers.Org": func(c *config.Config) {
			o := provider(c, "org_1/o")
			o.Org, o.APIKeySecret, o.Secrets = "", "", nil // a provider of the file has no org secrets
		},
		"providers.name":           func(c *config.Config) { renameProvider(c, "b", "b2") },
		"providers.Source":         func(c *config.Config) { provider(c, "b").Source = "pool" },
		"providers.kind":           func(c *config.Config) { a(c).Kind = "" }, // one kind: unset takes the default
		"providers.api_base":       func(c *config.Config) { a(c).APIBase = "https://127.0.0.1:9/v2" },
		"providers.api_key_env":    func(c *config.Config) { a(c).APIKeyEnv = "ROLTER_DIFF_KEY2" },
		"providers.headers":        func(c *config.Config) { a(c).Headers = map[string]string{"X-Team": "t2"} },
		"providers.api_key_secret": func(c *config.Config) { provider(c, "org_1/o").APIKeySecret = "k2" },
		"providers.header_secrets": func(c *config.Config) { provider(c, "org_1/o").HeaderSecrets = map[string]string{"X-Org": "k2"} },
		"providers.Secrets":        func(c *config.Config) { provider(c, "org_1/o").Secrets["k"] = "org secret three" },
		"providers.max_conns":      func(c *config.Config) { a(c).MaxConns = 65 },
		"providers.kv_events": func(c *config.Config) {
			// A source added to a provider that had none, and a route switched to precise_cache_aware.
			provider(c, "org_1/o").KVEvents = &config.KVEventsConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", ps.connect2)}
			r := route(c, "org_1/r")
			r.Strategy = "precise_cache_aware"
		},
		"providers.kv_events.endpoint": func(c *config.Config) {
			a(c).KVEvents.Endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", ps.connect2)
		},
		"providers.kv_events.topic": func(c *config.Config) { a(c).KVEvents.Topic = "kv@a2" },
		"providers.kv_events.replay_endpoint": func(c *config.Config) {
			a(c).KVEvents.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", ps.replay2)
		},
		"providers.kv_events.mode": func(c *config.Config) {
			a(c).KVEvents.Mode = "bind"
			a(c).KVEvents.Endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", ps.bind2)
		},
		"providers.kv_events.max_blocks": func(c *config.Config) { a(c).KVEvents.MaxBlocks = 2000 },
		"providers.kv_events.stale_secs": func(c *config.Config) { a(c).KVEvents.StaleSecs = 31 },
		"providers.kv_events.allowed_publishers": func(c *config.Config) {
			b(c).KVEvents.AllowedPublishers = []string{"127.0.0.0/8"}
		},
		"providers.kv_events.curve_secret_key_env": func(c *config.Config) {
			b(c).KVEvents.CurveSecretKeyEnv = "ROLTER_DIFF_CURVE"
			b(c).KVEvents.CurveClientKeys = []string{clientPublic}
		},
		"providers.kv_events.curve_client_keys": func(c *config.Config) {
			b(c).KVEvents.CurveSecretKeyEnv = "ROLTER_DIFF_CURVE"
			b(c).KVEvents.CurveClientKeys = []string{clientPublic, curvePublic}
		},
		"providers.lmcache":              func(c *config.Config) { b(c).LMCache = &config.LMCacheConfig{Endpoint: "http://127.0.0.1:10/lmcache"} },
		"providers.lmcache.endpoint":     func(c *config.Config) { a(c).LMCache.Endpoint = "http://127.0.0.1:9/lmcache/v2" },
		"providers.lmcache.refresh_secs": func(c *config.Config) { a(c).LMCache.RefreshSecs = 31 },
		"providers.lmcache.stale_secs":   func(c *config.Config) { a(c).LMCache.StaleSecs = 61 },

		"routes": func(c *config.Config) {
			c.Routes = append(c.Routes, config.RouteConfig{Model: "n", Strategy: "power_of_two", Targets: []config.TargetConfig{{Provider: "d"}}})
		},
		"routes.targets": func(c *config.Config) {
			r := route(c, "m")
			r.Targets = r.Targets[:1] // a target removed: the other keeps its tries and source
		},
		"routes.disaggregation": func(c *config.Config) {
			w := 1.0
			route(c, "c").Disaggregation = &config.DisaggregationConfig{Protocol: "vllm", PrefillThresholdTokens: ptr(0),
				Decode: []config.TargetConfig{{Provider: "d", Model: "c", Weight: &w}}}
		},
		"routes.disaggregation.protocol": func(c *config.Config) {
			d := route(c, "pd").Disaggregation
			d.Protocol, d.BootstrapPort = "vllm", nil
		},
		"routes.disaggregation.decode": func(c *config.Config) {
			d := route(c, "pd").Disaggregation
			d.Decode = append(d.Decode, config.TargetConfig{Provider: "d", Model: "up-d", Weight: ptr(1.0)})
		},
		"routes.disaggregation.decode.provider":          func(c *config.Config) { route(c, "pd").Disaggregation.Decode[0].Provider = "d" },
		"routes.disaggregation.decode.model":             func(c *config.Config) { route(c, "pd").Disaggregation.Decode[0].Model = "up-d2" },
		"routes.disaggregation.decode.weight":            func(c *config.Config) { route(c, "pd").Disaggregation.Decode[0].Weight = ptr(3.0) },
		"routes.disaggregation.prefill_threshold_tokens": func(c *config.Config) { route(c, "pd").Disaggregation.PrefillThresholdTokens = ptr(100) },
		"routes.disaggregation.bootstrap_port":           func(c *config.Config) { route(c, "pd").Disaggregation.BootstrapPort = ptr(9000) },
		"routes.shadow": func(c *config.Config) {
			route(c, "c").Shadow = &config.ShadowConfig{Strategies: []string{"pipeline", "precise_cache_aware"}}
		},
		"routes.lora": func(c *config.Config) {
			route(c, "h").LoRA = &config.LoRAConfig{Adapters: []string{"h-x"}, HomeReplicas: ptr(1), MaxHomeReplicas: ptr(2),
				ReplicaRequests: ptr(8), CoolSecs: ptr(30.0), MaxLoRAs: ptr(1), LoadTimeoutSecs: ptr(60.0)}
		},
		"routes.lora.adapters": func(c *config.Config) {
			l := route(c, "l").LoRA
			l.Adapters = append(l.Adapters, "l-z")
		},
		"routes.lora.home_replicas":     func(c *config.Config) { route(c, "l").LoRA.HomeReplicas = ptr(2) },
		"routes.lora.max_home_replicas": func(c *config.Config) { route(c, "l").LoRA.MaxHomeReplicas = ptr(1) },
		"routes.lora.replica_requests":  func(c *config.Config) { route(c, "l").LoRA.ReplicaRequests = ptr(5) },
		"routes.lora.cool_secs":         func(c *config.Config) { route(c, "l").LoRA.CoolSecs = ptr(11.0) },
		"routes.lora.max_loras":         func(c *config.Config) { route(c, "l").LoRA.MaxLoRAs = ptr(3) },
		"routes.lora.dynamic_lora": func(c *config.Config) {
			l := route(c, "l").LoRA
			l.DynamicLoRA, l.AdapterPath = false, ""
		},
		"routes.lora.adapter_path":      func(c *config.Config) { route(c, "l").LoRA.AdapterPath = "/l2/{adapter}" },
		"routes.lora.load_timeout_secs": func(c *config.Config) { route(c, "l").LoRA.LoadTimeoutSecs = ptr(21.0) },
		// Set by ServedRoutes on the routes it makes for adapters, never by a config: the adapter routes change
		// with routes.lora.adapters.
		"routes.LoRABase": func(c *config.Config) {
			l := route(c, "l").LoRA
			l.Adapters = l.Adapters[:1]
		},
		"routes.Org":        func(c *config.Config) { route(c, "c").Org = "org_2" },
		"routes.Discovered": func(c *config.Config) { route(c, "c").Discovered = []string{"pool"} },
		"routes.model":      func(c *config.Config) { route(c, "c").Model = "c2" },
		"routes.strategy": func(c *config.Config) {
			route(c, "h").Strategy = "least_load"
			route(c, "h").Params = config.RouteParams{}
		},
		"routes.targets.provider": func(c *config.Config) {
			route(c, "c").Targets[1].Provider = "d"
		},
		"routes.targets.model":         func(c *config.Config) { route(c, "m").Targets[0].Model = "up-a2" },
		"routes.targets.weight":        func(c *config.Config) { route(c, "p").Targets[1].Weight = ptr(3.0) },
		"routes.params.threshold":      func(c *config.Config) { route(c, "m").Params.Threshold = ptr(0.6) },
		"routes.params.max_trie_nodes": func(c *config.Config) { route(c, "m").Params.MaxTrieNodes = ptr(2000) },
		"routes.params.max_trie_bytes": func(c *config.Config) { route(c, "m").Params.MaxTrieBytes = ptr(200000) },
		"routes.params.session_ttl_secs": func(c *config.Config) {
			route(c, "p").Params.SessionTTLSecs = ptr(61.0)
		},
		"routes.params.max_sessions":    func(c *config.Config) { route(c, "p").Params.MaxSessions = ptr(101) },
		"routes.params.epsilon":         func(c *config.Config) { route(c, "h").Params.Epsilon = ptr(0.3) },
		"routes.params.virtual_nodes":   func(c *config.Config) { route(c, "h").Params.VirtualNodes = ptr(41) },
		"routes.params.key_bytes":       func(c *config.Config) { route(c, "h").Params.KeyBytes = ptr(257) },
		"routes.params.weight_factor":   func(c *config.Config) { route(c, "p").Params.WeightFactor = ptr(2.0) },
		"routes.params.load_factor":     func(c *config.Config) { route(c, "p").Params.LoadFactor = ptr(2.0) },
		"routes.params.cache_factor":    func(c *config.Config) { route(c, "p").Params.CacheFactor = ptr(2.0) },
		"routes.params.stale_gap":       func(c *config.Config) { route(c, "m").Params.StaleGap = ptr(0.5) },
		"routes.params.stale_window":    func(c *config.Config) { route(c, "m").Params.StaleWindow = ptr(51) },
		"routes.params.home":            func(c *config.Config) { route(c, "m").Params.Home = ptr(false) },
		"routes.params.overload_margin": func(c *config.Config) { route(c, "c").Params.OverloadMargin = ptr(3.0) },
		"routes.params.overload_factor": func(c *config.Config) { route(c, "c").Params.OverloadFactor = ptr(2.0) },
		"routes.params.hot_window":      func(c *config.Config) { route(c, "p").Params.HotWindow = ptr(128) },
		"routes.params.load_bound":      func(c *config.Config) { route(c, "p").Params.LoadBound = ptr(0.5) },
		"routes.shadow.strategies": func(c *config.Config) {
			route(c, "m").Shadow.Strategies = []string{"cache_aware", "pipeline"}
		},

		"metrics_scrape.enabled":       func(c *config.Config) { c.MetricsScrape.Enabled = false },
		"metrics_scrape.interval_secs": func(c *config.Config) { c.MetricsScrape.IntervalSecs = 31 },
		"metrics_scrape.timeout_secs":  func(c *config.Config) { c.MetricsScrape.TimeoutSecs = 2 },
		"metrics_scrape.path":          func(c *config.Config) { c.MetricsScrape.Path = "/m2" },

		"health.enabled":              func(c *config.Config) { c.Health.Enabled = false },
		"health.path":                 func(c *config.Config) { c.Health.Path = "/h2" },
		"health.interval_secs":        func(c *config.Config) { c.Health.IntervalSecs = 31 },
		"health.timeout_secs":         func(c *config.Config) { c.Health.TimeoutSecs = 2 },
		"health.unhealthy_threshold":  func(c *config.Config) { c.Health.UnhealthyThreshold = 3 },
		"health.healthy_threshold":    func(c *config.Config) { c.Health.HealthyThreshold = 3 },
		"health.fail_open":            func(c *config.Config) { c.Health.FailOpen = false },
		"health.max_ejection_percent": func(c *config.Config) { c.Health.MaxEjectionPercent = 40 },

		"cooldown.enabled":              func(c *config.Config) { c.Cooldown.Enabled = false },
		"cooldown.failures":             func(c *config.Config) { c.Cooldown.Failures = 4 },
		"cooldown.window_secs":          func(c *config.Config) { c.Cooldown.WindowSecs = 11 },
		"cooldown.base_secs":            func(c *config.Config) { c.Cooldown.BaseSecs = 6 },
		"cooldown.max_secs":             func(c *config.Config) { c.Cooldown.MaxSecs = 61 },
		"cooldown.max_retry_after_secs": func(c *config.Config) { c.Cooldown.MaxRetryAfterSecs = 61 },
		"cooldown.consecutive_5xx":      func(c *config.Config) { c.Cooldown.Consecutive5xx = 6 },

		"breaker.enabled":          func(c *config.Config) { c.Breaker.Enabled = false },
		"breaker.failures":         func(c *config.Config) { c.Breaker.Failures = 6 },
		"breaker.open_secs":        func(c *config.Config) { c.Breaker.OpenSecs = 11 },
		"breaker.half_open_probes": func(c *config.Config) { c.Breaker.HalfOpenProbes = 2 },

		"retry.max_retries":    func(c *config.Config) { c.Retry.MaxRetries = 3 },
		"retry.backoff_ms":     func(c *config.Config) { c.Retry.BackoffMs = 26 },
		"retry.max_backoff_ms": func(c *config.Config) { c.Retry.MaxBackoffMs = 501 },

		"timeouts.connect_secs": func(c *config.Config) { c.Timeouts.ConnectSecs = 6 },
		"timeouts.headers_secs": func(c *config.Config) { c.Timeouts.HeadersSecs = 601 },
		"timeouts.idle_secs":    func(c *config.Config) { c.Timeouts.IdleSecs = 121 },

		"queue.max_inflight":            func(c *config.Config) { c.Queue.MaxInflight = 101 },
		"queue.max_inflight_per_target": func(c *config.Config) { c.Queue.MaxInflightPerTarget = 11 },
		"queue.max_waiting_per_target":  func(c *config.Config) { c.Queue.MaxWaitingPerTarget = 6 },
		"queue.wait_timeout_secs":       func(c *config.Config) { c.Queue.WaitTimeoutSecs = 6 },
		"queue.retry_after_secs":        func(c *config.Config) { c.Queue.RetryAfterSecs = 2 },

		"egress.block_metadata":   func(c *config.Config) { c.Egress.BlockMetadata = false },
		"egress.kv_bind_ports":    func(c *config.Config) { c.Egress.KVBindPorts = []int{5600} },
		"egress.block_link_local": func(c *config.Config) { c.Egress.BlockLinkLocal = false },
		"egress.block_loopback":   func(c *config.Config) { c.Egress.BlockLoopback = true }, // allow_cidrs still admits 127/8
		"egress.block_private":    func(c *config.Config) { c.Egress.BlockPrivate = true },
		"egress.allow_hosts":      func(c *config.Config) { c.Egress.AllowHosts = []string{"localhost", "example.internal"} },
		"egress.deny_hosts":       func(c *config.Config) { c.Egress.DenyHosts = []string{"evil2.example"} },
		"egress.allow_cidrs":      func(c *config.Config) { c.Egress.AllowCIDRs = []string{"127.0.0.0/16"} },
		"egress.deny_cidrs":       func(c *config.Config) { c.Egress.DenyCIDRs = []string{"10.9.8.0/24"} },

		"control.enabled":            func(c *config.Config) { c.Control.Enabled = true },
		"control.listen":             func(c *config.Config) { c.Control.Listen = "127.0.0.1:1" },
		"control.store":              func(c *config.Config) { c.Control.Store = filepath.Join(dir, "other.db") },
		"control.admin_token_env":    func(c *config.Config) { c.Control.AdminTokenEnv = "OTHER_TOKEN" },
		"control.hosts":              func(c *config.Config) { c.Control.Hosts = []string{"control.example"} },
		"control.max_conns":          func(c *config.Config) { c.Control.MaxConns = 65 },
		"control.read_timeout_secs":  func(c *config.Config) { c.Control.ReadTimeoutSecs = 11 },
		"control.write_timeout_secs": func(c *config.Config) { c.Control.WriteTimeoutSecs = 61 },
		"control.idle_timeout_secs":  func(c *config.Config) { c.Control.IdleTimeoutSecs = 61 },
		"control.provider_env":       func(c *config.Config) { c.Control.ProviderEnv = []string{"ROLTER_DIFF_KEY2"} },
		"control.secrets_key_env":    func(c *config.Config) { c.Control.SecretsKeyEnv = "ROLTER_DIFF_SECRETS" },
		"control.tls_cert_file":      func(c *config.Config) { c.Control.TLSCertFile, c.Control.TLSKeyFile = cert, key },
		"control.tls_key_file":       func(c *config.Config) { c.Control.TLSCertFile, c.Control.TLSKeyFile = cert, key },
		"control.tls_client_ca_file": func(c *config.Config) {
			c.Control.TLSCertFile, c.Control.TLSKeyFile, c.Control.TLSClientCAFile = cert, key, cert
		},
		"control.tls_min_version":             func(c *config.Config) { c.Control.TLSMinVersion = "1.3" },
		"control.quotas.routing_memory_bytes": func(c *config.Config) { c.Control.Quotas.RoutingMemoryBytes = 1 << 27 },
		"control.quotas.routes":               func(c *config.Config) { c.Control.Quotas.Routes = 65 },
		"control.quotas.providers":            func(c *config.Config) { c.Control.Quotas.Providers = 65 },
		"control.quotas.targets_per_route":    func(c *config.Config) { c.Control.Quotas.TargetsPerRoute = 17 },
		"control.quotas.targets":              func(c *config.Config) { c.Control.Quotas.Targets = 257 },
		"control.quotas.keys":                 func(c *config.Config) { c.Control.Quotas.Keys = 65 },
		"control.quotas.tokens":               func(c *config.Config) { c.Control.Quotas.Tokens = 17 },

		"cluster.nats_url":              func(c *config.Config) { c.Cluster.NATSURL = "nats://127.0.0.1:4222" },
		"cluster.subject":               func(c *config.Config) { c.Cluster.Subject = "other" },
		"cluster.publish_interval_ms":   func(c *config.Config) { c.Cluster.PublishIntervalMs = 21 },
		"cluster.max_entries":           func(c *config.Config) { c.Cluster.MaxEntries = 1 << 19 },
		"cluster.evidence_ttl_secs":     func(c *config.Config) { c.Cluster.EvidenceTTLSecs = 601 },
		"cluster.key_env":               func(c *config.Config) { c.Cluster.KeyEnv = "ROLTER_DIFF_CLUSTER_KEY" },
		"cluster.user_env":              func(c *config.Config) { c.Cluster.UserEnv = "ROLTER_DIFF_USER" },
		"cluster.password_env":          func(c *config.Config) { c.Cluster.PasswordEnv = "ROLTER_DIFF_PASSWORD" },
		"cluster.token_env":             func(c *config.Config) { c.Cluster.TokenEnv = "ROLTER_DIFF_TOKEN" },
		"cluster.nkey_seed_file":        func(c *config.Config) { c.Cluster.NKeySeedFile = filepath.Join(dir, "nkey.seed") },
		"cluster.creds_file":            func(c *config.Config) { c.Cluster.CredsFile = filepath.Join(dir, "nats.creds") },
		"cluster.tls_ca_file":           func(c *config.Config) { c.Cluster.TLSCAFile = filepath.Join(dir, "ca.pem") },
		"cluster.tls_cert_file":         func(c *config.Config) { c.Cluster.TLSCertFile = filepath.Join(dir, "cert.pem") },
		"cluster.tls_key_file":          func(c *config.Config) { c.Cluster.TLSKeyFile = filepath.Join(dir, "key.pem") },
		"cluster.max_peers":             func(c *config.Config) { c.Cluster.MaxPeers = 65 },
		"cluster.max_peer_inflight":     func(c *config.Config) { c.Cluster.MaxPeerInflight = 1025 },
		"cluster.peer_evidence_per_sec": func(c *config.Config) { c.Cluster.PeerEvidencePerSec = 50001 },
		"cluster.queue_size":            func(c *config.Config) { c.Cluster.QueueSize = 4097 },

		"docs.base_url": func(c *config.Config) { c.Docs.BaseURL = "https://docs2.example/" },

		"trace.path":        func(c *config.Config) { c.Trace.Path = filepath.Join(dir, "trace2.jsonl") },
		"trace.max_bytes":   func(c *config.Config) { c.Trace.MaxBytes = 50 << 20 },
		"trace.keep":        func(c *config.Config) { c.Trace.Keep = 6 },
		"trace.block_bytes": func(c *config.Config) { c.Trace.BlockBytes *= 2 },
		"trace.salt_env":    func(c *config.Config) { c.Trace.SaltEnv = "ROLTER_DIFF_SALT" },
		"trace.queue_size":  func(c *config.Config) { c.Trace.QueueSize = 4097 },

		"log.access":     func(c *config.Config) { c.Log.Access = filepath.Join(dir, "access2.log") },
		"log.format":     func(c *config.Config) { c.Log.Format = "text" },
		"log.sample":     func(c *config.Config) { c.Log.Sample = 0.5 },
		"log.slow_ms":    func(c *config.Config) { c.Log.SlowMs = 100 },
		"log.max_bytes":  func(c *config.Config) { c.Log.MaxBytes = 50 << 20 },
		"log.keep":       func(c *config.Config) { c.Log.Keep++ },
		"log.queue_size": func(c *config.Config) { c.Log.QueueSize++ },

		"tracing.endpoint":     func(c *config.Config) { c.Tracing.Endpoint = "http://127.0.0.1:10/v1/traces" },
		"tracing.protocol":     func(c *config.Config) { c.Tracing.Protocol = "grpc"; c.Tracing.Endpoint = "http://127.0.0.1:9" },
		"tracing.sample_ratio": func(c *config.Config) { c.Tracing.SampleRatio = 0.2 },
		"tracing.service_name": func(c *config.Config) { c.Tracing.ServiceName = "other" },
		"tracing.headers":      func(c *config.Config) { c.Tracing.Headers = map[string]string{"X-Tenant": "t2"} },
		"tracing.queue_size":   func(c *config.Config) { c.Tracing.QueueSize++ },
		"tracing.timeout_secs": func(c *config.Config) { c.Tracing.TimeoutSecs = 11 },

		"File": func(c *config.Config) { c.File = "other.toml" },
		"Keys": func(c *config.Config) {
			c.Keys = append(c.Keys, config.DataKey{Org: "org_1", Hash: sha256.Sum256([]byte("key two"))})
		},
		"KeyPepper": func(c *config.Config) { c.KeyPepper = [32]byte{2} },

		"limits.org.rpm":            func(c *config.Config) { c.Limits.Org.RPM = 100 },
		"limits.org.tpm":            func(c *config.Config) { c.Limits.Org.TPM = 1000 },
		"limits.org.concurrent":     func(c *config.Config) { c.Limits.Org.Concurrent = 5 },
		"limits.org.models":         func(c *config.Config) { c.Limits.Org.Models = map[string]config.ModelLimits{"m": {RPM: 3}} },
		"limits.key.rpm":            func(c *config.Config) { c.Limits.Key.RPM = 10 },
		"limits.key.tpm":            func(c *config.Config) { c.Limits.Key.TPM = 500 },
		"limits.key.concurrent":     func(c *config.Config) { c.Limits.Key.Concurrent = 2 },
		"limits.key.models":         func(c *config.Config) { c.Limits.Key.Models = map[string]config.ModelLimits{"m": {TPM: 30}} },
		"limits.default_max_tokens": func(c *config.Config) { c.Limits.DefaultMaxTokens = ptr(int64(77)) },
		"OrgLimits": func(c *config.Config) {
			c.OrgLimits = map[string]config.OrgLimits{"org_1": {Org: &config.Limits{RPM: 9}, Keys: &config.Limits{TPM: 99}}}
		},
	}
}

// renameProvider renames provider from to to, in the routes too.
func renameProvider(c *config.Config, from, to string) {
	provider(c, from).Name = to
	rename := func(pool []config.TargetConfig) {
		for j := range pool {
			if pool[j].Provider == from {
				pool[j].Provider = to
			}
		}
	}
	for i := range c.Routes {
		rename(c.Routes[i].Targets)
		if d := c.Routes[i].Disaggregation; d != nil {
			rename(d.Decode)
		}
	}
}

// diffGateway starts a gateway on cfg without serving: Built describes what New and Reload built.
// Upstreams are dialed in memory (nothing answers); KV-event endpoints are real loopback sockets.
func diffGateway(t *testing.T, cfg *config.Config) *Gateway {
	t.Helper()
	g, err := New(cfg, Options{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Dial:   func(string, time.Duration) (net.Conn, error) { return nil, errors.New("no upstream in this test") },
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// closer shuts gateways down in the background: stopping a KV-event subscriber takes a quarter of a
// second, which the next field's gateways need not wait for (what Built describes does not depend on
// whether an old socket still holds a port).
type closer struct {
	t  *testing.T
	wg sync.WaitGroup
}

func (c *closer) close(g *Gateway) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.Shutdown(ctx); err != nil {
			c.t.Errorf("shutdown: %s", err)
		}
	}()
}

// TestReloadDifferential pins what a reload builds: for every field of the config (every section, every
// field of providers, routes, targets, parameters, shadows, KV-event sources, LMCache, and the data-plane
// keys), a gateway started on a base config and reloaded with that one field changed is built exactly as a
// gateway started on the changed config - nothing a reload carries over may keep an old setting. A field
// that needs a restart is refused instead, and nothing changes.
func TestReloadDifferential(t *testing.T) {
	dir := t.TempDir()
	ps := newDiffPorts(t)
	muts := diffMutations(t, dir, ps)
	c := &closer{t: t}
	defer c.wg.Wait()
	paths := configPaths()
	for path := range muts {
		if !slices.Contains(paths, path) {
			t.Errorf("the mutation for %s names no field of Config", path)
		}
	}
	for _, path := range paths {
		if fleetPath(path) {
			continue
		}
		t.Run(path, func(t *testing.T) {
			if muts[path] == nil {
				t.Fatalf("add a mutation for %s", path)
			}
			// Each field's gateways bind ports of their own: the last field's may still be closing.
			ps := ps.rebound(t)
			twin := ps.rebound(t)
			fresh := func() *config.Config {
				cfg := diffConfig(t, dir, twin)
				diffMutations(t, dir, twin)[path](cfg)
				return cfg
			}
			mut := diffMutations(t, dir, ps)[path]
			checkReloadField(t, c, path, mut, func() *config.Config { return diffConfig(t, dir, ps) }, fresh,
				func(desc string) string { return ps.mapBinds(desc, twin) })
		})
	}
}

// checkReloadField reloads a gateway on base() with mut applied, and compares what it built with a fresh
// gateway on fresh(), the same config on other bind ports, whose description mapDesc writes in base's (or,
// for a field that needs a restart, with what it built before).
func checkReloadField(t *testing.T, c *closer, path string, mut func(*config.Config), base, fresh func() *config.Config,
	mapDesc func(string) string) {
	t.Helper()
	g := diffGateway(t, base())
	before := g.Built()
	next := base()
	mut(next)
	err := g.Reload(next)
	after := g.Built()
	c.close(g)
	if restartPath(path) {
		if err == nil || !strings.Contains(err.Error(), "needs a restart") {
			t.Fatalf("a reload changing %s (which needs a restart): %v", path, err)
		}
		if after != before {
			t.Fatalf("a refused reload changed the gateway:\n%s", lineDiff(before, after))
		}
		return
	}
	if err != nil {
		t.Fatalf("reload: %s", err)
	}
	fc := fresh()
	if errs := config.Validate(fc); len(errs) > 0 {
		t.Fatalf("the mutation of %s is invalid: %s", path, errs)
	}
	f := diffGateway(t, fc)
	want := mapDesc(f.Built())
	c.close(f)
	if after != want {
		t.Fatalf("reloaded onto a changed %s, the gateway is not built as one started on it (- reloaded, + fresh):\n%s",
			path, lineDiff(after, want))
	}
	if !invisible[path] && after == before {
		t.Fatalf("changing %s changed nothing the gateway describes: the mutation is a no-op or Built misses it", path)
	}
}

// lineDiff lists the lines of a that b lacks (-) and those of b that a lacks (+).
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out []string
	for _, l := range al {
		if !slices.Contains(bl, l) {
			out = append(out, "- "+l)
		}
	}
	for _, l := range bl {
		if !slices.Contains(al, l) {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

// TestReloadRereadsEnvironment: the secrets a config names by environment variable (a provider's
// api_key_env, a bind source's curve_secret_key_env, the trace's salt_env) are read again at each reload:
// a SIGHUP after the variable changed builds what a fresh start would, though the config is the same.
func TestReloadRereadsEnvironment(t *testing.T) {
	dir := t.TempDir()
	ps := newDiffPorts(t)
	_, otherSecret, err := zmq.NewCurveKeypair()
	if err != nil {
		t.Fatal(err)
	}
	muts := diffMutations(t, dir, ps) // the mutations used here name no port
	base := func(ps diffPorts) *config.Config {
		cfg := diffConfig(t, dir, ps)
		muts["providers.kv_events.curve_secret_key_env"](cfg)
		muts["trace.salt_env"](cfg)
		if errs := config.Validate(cfg); len(errs) > 0 {
			t.Fatal(errs)
		}
		return cfg
	}
	c := &closer{t: t}
	defer c.wg.Wait()
	for name, value := range map[string]string{"ROLTER_DIFF_KEY": "secret three", "ROLTER_DIFF_CURVE": otherSecret,
		"ROLTER_DIFF_SALT": "salt two"} {
		t.Run(name, func(t *testing.T) {
			ps := ps.rebound(t)
			twin := ps.rebound(t)
			g := diffGateway(t, base(ps))
			before := g.Built()
			next := base(ps)
			t.Setenv(name, value)
			if err := g.Reload(next); err != nil {
				t.Fatalf("reload: %s", err)
			}
			after := g.Built()
			c.close(g)
			f := diffGateway(t, base(twin))
			want := ps.mapBinds(f.Built(), twin)
			c.close(f)
			if after != want {
				t.Fatalf("reloaded after %s changed, the gateway is not built as one started then (- reloaded, + fresh):\n%s",
					name, lineDiff(after, want))
			}
			if after == before {
				t.Fatalf("a new value of %s changed nothing the gateway describes", name)
			}
		})
	}
}
