package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/kvindex"
)

const goodConfig = `
[server]
listen = "127.0.0.1:0"

[[providers]]
name = "vllm-1"
api_base = "http://127.0.0.1:8001"

[[providers]]
name = "vllm-2"
kind = "openai_compatible"
api_base = "http://127.0.0.1:8002/v1"
headers = { "X-Team" = "search" }

[[routes]]
model = "llama"
strategy = "weighted"

[[routes.targets]]
provider = "vllm-1"
model = "meta-llama/Llama-3.1-8B-Instruct"
weight = 2

[[routes.targets]]
provider = "vllm-2"
`

func TestParseConfigDefaults(t *testing.T) {
	cfg, err := Parse([]byte(goodConfig), "good.toml")
	if err != nil {
		t.Fatalf("unexpected error: %s", err)
	}
	f := func(name string, got, want any) {
		t.Helper()
		if got != want {
			t.Fatalf("%s: got %v, want %v", name, got, want)
		}
	}
	f("max_body_bytes", cfg.Server.MaxBodyBytes, 16<<20)
	f("expose_decision_headers", cfg.Server.ExposeDecisionHeaders, true)
	f("kind default", cfg.Providers[0].Kind, "openai_compatible")
	f("target model default", cfg.Routes[0].Targets[1].Model, "llama")
	f("weight default", *cfg.Routes[0].Targets[1].Weight, 1.0)
	f("weight", *cfg.Routes[0].Targets[0].Weight, 2.0)
	f("max_retries", cfg.Retry.MaxRetries, 2)
	f("headers", cfg.Providers[1].Headers["X-Team"], "search")
	f("strategy default", mustParse(t, strings.Replace(goodConfig, `strategy = "weighted"`, "", 1)).Routes[0].Strategy, "round_robin")
}

func mustParse(t *testing.T, s string) *Config {
	t.Helper()
	cfg, err := Parse([]byte(s), "x.toml")
	if err != nil {
		t.Fatalf("unexpected error: %s", err)
	}
	return cfg
}

// TestParseConfigErrors pins that every problem is reported, each with its file:line and key.
func TestParseConfigErrors(t *testing.T) {
	f := func(src string, want ...string) {
		t.Helper()
		_, err := Parse([]byte(src), "bad.toml")
		if err == nil {
			t.Fatalf("expected errors for:\n%s", src)
		}
		var ce Errors
		if !errors.As(err, &ce) {
			t.Fatalf("want Errors, got %T: %s", err, err)
		}
		got := err.Error()
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Fatalf("error output lacks %q:\n%s", w, got)
			}
		}
		if len(ce) != len(want) {
			t.Fatalf("want %d errors, got %d:\n%s", len(want), len(ce), got)
		}
	}
	f(`[server]
listen = ":8080"
lisen = ":9"`, `bad.toml:3: server.lisen: unknown key`)

	f(`[[providers]]
name = "a"
api_base = "ftp://x"

[[providers]]
name = "a"
api_base = "http://127.0.0.1:1"
kind = "grpc"

[[routes]]
model = "m"
strategy = "best_guess"

[[routes.targets]]
provider = "nope"
weight = 0

[[routes]]
model = "m"
`,
		`bad.toml:3: providers[0].api_base: URL "ftp://x" must start with http:// or https://`,
		`bad.toml:6: providers[1].name: duplicate provider name "a"`,
		`bad.toml:8: providers[1].kind: unknown provider kind "grpc"`,
		`bad.toml:12: routes[0].strategy: unknown strategy "best_guess"`,
		`bad.toml:15: routes[0].targets[0].provider: unknown provider "nope"`,
		`bad.toml:16: routes[0].targets[0].weight: weight must be > 0`,
		`bad.toml:19: routes[1].model: duplicate route for model "m"`,
		`bad.toml:18: routes[1].targets: route "m" has no targets`,
	)

	f(`[[providers]]
name = "a"
api_base = "http://127.0.0.1:1"
[[routes]]
model = "m"
strategy = "round_robin"
[routes.params]
threshold = 0.7
[[routes.targets]]
provider = "a"
`, `bad.toml:8: routes[0].params.threshold: strategy "round_robin" takes no parameters`)

	f(`[retry]
max_retries = -1
[timeouts]
idle_secs = 0`, `bad.toml:2: retry.max_retries`, `bad.toml:4: timeouts.idle_secs: must be > 0`)

	f("[server\nlisten=1", "bad.toml:2: expected")
	f("[server]\nlisten = 8080", "bad.toml:2:")

	f(`[[providers]]
name = "a"
api_base = "http://127.0.0.1:1"
api_key_env = "ROLTER_TEST_SURELY_UNSET_VAR"`, `bad.toml:4: providers[0].api_key_env: environment variable "ROLTER_TEST_SURELY_UNSET_VAR" is not set`)
}

func TestLoadConfigFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rolter.toml")
	if err := os.WriteFile(path, []byte(goodConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err != nil {
		t.Fatalf("unexpected error: %s", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.toml")); err == nil || !strings.Contains(err.Error(), "cannot read config") {
		t.Fatalf("want a read error, got %v", err)
	}
}

func TestScanKeyLines(t *testing.T) {
	kl := scanKeyLines([]byte(`# comment
[server]
listen = ":1"   # trailing
[[providers]]
name = "a"
headers = { a = "b",
  c = "d" }
[[providers]]
name = "b"
[providers.kv_events]
endpoint = "tcp://x:1"
[[routes]]
model = """
multi
"""
[[routes.targets]]
provider = "a"
[[routes.targets]]
provider = "b"
`))
	f := func(path string, want int) {
		t.Helper()
		if got := kl.lineOf(path); got != want {
			t.Fatalf("lineOf(%q) = %d, want %d", path, got, want)
		}
	}
	f("server.listen", 3)
	f("providers[0].name", 5)
	f("providers[0].headers", 6)
	f("providers[1].name", 9)
	f("providers[1].kv_events.endpoint", 11)
	f("routes[0].model", 13)
	f("routes[0].targets[0].provider", 17)
	f("routes[0].targets[1].provider", 19)
	f("routes[0].targets[1].weight", 18) // unset key: falls back to its table
	if got := kl.nthLine("routes.targets.provider", 1); got != 19 {
		t.Fatalf("nthLine = %d, want 19", got)
	}
}

// TestKVEventsNeedCgo: without cgo (no libzmq) a config that uses kv_events is refused with a clear message;
// with cgo it loads.
func TestKVEventsNeedCgo(t *testing.T) {
	src := `[[providers]]
name = "a"
api_base = "http://127.0.0.1:1"
[providers.kv_events]
endpoint = "tcp://127.0.0.1:5557"
[[routes]]
model = "m"
strategy = "precise_cache_aware"
[[routes.targets]]
provider = "a"
`
	_, err := Parse([]byte(src), "kv.toml")
	if kvindex.Supported {
		if err != nil {
			t.Fatalf("cgo build refused kv_events: %s", err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), "kv.toml:4: providers[0].kv_events: kv_events needs a build with cgo") {
		t.Fatalf("no-cgo build: got %v", err)
	}
}

// TestPreciseNeedsKVEvents: every target of a precise_cache_aware route needs a KV-event source.
func TestPreciseNeedsKVEvents(t *testing.T) {
	src := `[[providers]]
name = "a"
api_base = "http://127.0.0.1:1"
[[routes]]
model = "m"
strategy = "precise_cache_aware"
[[routes.targets]]
provider = "a"
`
	_, err := Parse([]byte(src), "kv.toml")
	if err == nil || !strings.Contains(err.Error(), `kv.toml:8: routes[0].targets[0].provider: strategy "precise_cache_aware" needs [providers.kv_events] on provider "a"`) {
		t.Fatalf("got %v", err)
	}
}

// TestKVEventsValidation: kv_events values the subscriber would refuse are refused by the config already,
// by kvindex's own rules, each under its key and line. Builds without cgo check them too (and refuse the
// table as well).
func TestKVEventsValidation(t *testing.T) {
	f := func(kv, want string) {
		t.Helper()
		src := "[[providers]]\nname = \"a\"\napi_base = \"http://127.0.0.1:1\"\n[providers.kv_events]\n" + kv
		_, err := Parse([]byte(src), "kv.toml")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%q: got %v, want %q", kv, err, want)
		}
	}
	f("endpoint = \"tcp://127.0.0.1\"", "kv.toml:5: providers[0].kv_events.endpoint: cannot use endpoint")
	f("endpoint = \"udp://x:1\"", "want tcp://, ipc:// or inproc://")
	f("mode = \"bind\"", "kv.toml:4: providers[0].kv_events.endpoint: cannot use endpoint: empty address")
	f("endpoint = \"tcp://x:1\"\nreplay_endpoint = \"tcp://\"", "kv.toml:6: providers[0].kv_events.replay_endpoint")
	f("endpoint = \"tcp://x:1\"\nmax_blocks = 99999999", "kv.toml:6: providers[0].kv_events.max_blocks: cannot use max_blocks 99999999: must be in 0..")
	f("endpoint = \"tcp://x:1\"\nmax_blocks = -1", "kv.toml:6: providers[0].kv_events.max_blocks: cannot use max_blocks -1")
	f("endpoint = \"tcp://x:1\"\nmode = \"pull\"", "kv.toml:6: providers[0].kv_events.mode: cannot use mode \"pull\"")
	f("endpoint = \"tcp://x:1\"\nstale_secs = -2", "kv.toml:6: providers[0].kv_events.stale_secs: cannot use stale_secs -2s: must not be negative")
	f("endpoint = \"tcp://x:1\"\nstale_secs = nan", "kv.toml:6: providers[0].kv_events.stale_secs: must be a finite number of seconds")
	f("endpoint = \"tcp://x:1\"\nstale_secs = 1e300", "kv.toml:6: providers[0].kv_events.stale_secs: must be a finite number of seconds")
}

// TestKVKey pins the coupling with kvindex's messages: every error of kvindex.SubscriberConfig.Validate for
// a [providers.kv_events] key is reported on that key, not on the table.
func TestKVKey(t *testing.T) {
	f := func(sc kvindex.SubscriberConfig, want ...string) {
		t.Helper()
		errs := unjoin(sc.Validate())
		if len(errs) != len(want) {
			t.Fatalf("%+v: want %d errors, got %v", sc, len(want), errs)
		}
		for i, err := range errs {
			if got := kvKey(err); got != want[i] {
				t.Fatalf("kvKey(%q) = %q, want %q", err, got, want[i])
			}
		}
	}
	f(kvindex.SubscriberConfig{Endpoint: "tcp://x:1"})
	f(kvindex.SubscriberConfig{Endpoint: "", ReplayEndpoint: "udp://x", Mode: "pull", StaleAfter: -1, MaxBlocks: -1},
		".endpoint", ".replay_endpoint", ".mode", ".stale_secs", ".max_blocks")
	f(kvindex.SubscriberConfig{Endpoint: "tcp://x:1", MaxQueueBytes: 1}, "") // not a rolter.toml key: the table
	if got := kvKey(errors.New("cannot use endpoints_x 1")); got != "" {
		t.Fatalf("a longer key matched: %q", got)
	}
}

// TestLMCacheValidation: the lmcache endpoint is checked by the poller's own rule (telemetry), under its
// key and line.
func TestLMCacheValidation(t *testing.T) {
	f := func(lc, want string) {
		t.Helper()
		src := "[[providers]]\nname = \"a\"\napi_base = \"http://127.0.0.1:1\"\n[providers.lmcache]\n" + lc
		cfg, err := Parse([]byte(src), "lc.toml")
		if want == "" {
			if err != nil {
				t.Fatalf("%q: unexpected error: %s", lc, err)
			}
			if p := cfg.Providers[0].LMCache; p.RefreshSecs != defaultLMCacheRefreshSecs || p.StaleSecs != defaultLMCacheStaleSecs {
				t.Fatalf("%q: defaults not set: %+v", lc, p)
			}
			return
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%q: got %v, want %q", lc, err, want)
		}
	}
	f(`endpoint = "http://127.0.0.1:2/status"`, "")
	f(`endpoint = "http://127.0.0.1:2/status?model=m"`, "") // the poller sends the query as is
	f(`refresh_secs = 1`, "lc.toml:4: providers[0].lmcache.endpoint: missing URL")
	f(`endpoint = "ftp://x/status"`, `lc.toml:5: providers[0].lmcache.endpoint: cannot use URL "ftp://x/status": scheme must be http or https`)
	f(`endpoint = "http://u:p@x/status"`, `lc.toml:5: providers[0].lmcache.endpoint: cannot use URL`)
	f("endpoint = \"http://x/s\"\nrefresh_secs = -1", "lc.toml:6: providers[0].lmcache.refresh_secs: must be > 0, got -1")
	f("endpoint = \"http://x/s\"\nstale_secs = inf", "lc.toml:6: providers[0].lmcache.stale_secs: must be > 0, got +Inf")
}

// TestConfigSectionErrors: each section reports every one of its problems, each under its key and line.
func TestConfigSectionErrors(t *testing.T) {
	f := func(src string, want ...string) {
		t.Helper()
		_, err := Parse([]byte(src), "s.toml")
		var ce Errors
		if !errors.As(err, &ce) {
			t.Fatalf("want Errors, got %v", err)
		}
		if len(ce) != len(want) {
			t.Fatalf("want %d errors, got %d:\n%s", len(want), len(ce), err)
		}
		for i, w := range want {
			if got := ce[i].Error(); got != w {
				t.Fatalf("error %d: got %q, want %q", i, got, w)
			}
		}
	}
	f("[server]\nlisten = \"8080\"\nmax_body_bytes = 100\nmax_body_memory_bytes = 10\nmax_conns = -1\nrouting_memory_bytes = 1\ndrain_secs = -1",
		`s.toml:2: server.listen: cannot parse listen address "8080": want host:port`,
		`s.toml:4: server.max_body_memory_bytes: must be >= server.max_body_bytes (100), got 10`,
		`s.toml:5: server.max_conns: must be >= 0, got -1`,
		`s.toml:6: server.routing_memory_bytes: must be >= 1048576 (1 MiB), got 1`,
		`s.toml:7: server.drain_secs: must be >= 0, got -1`)
	f("[[providers]]\nname = \"\"\napi_base = \"http://x:99999\"\nheaders = { Host = \"h\", \"a b\" = \"c\" }\nmax_conns = -1",
		`s.toml:2: providers[0].name: missing provider name`,
		`s.toml:3: providers[0].api_base: URL "http://x:99999" has a bad port`,
		`s.toml:4: providers[0].headers: invalid header name "Host"`,
		`s.toml:4: providers[0].headers: invalid header name "a b"`,
		`s.toml:5: providers[0].max_conns: must be > 0, got -1`)
	f("[[providers]]\nname = \"a\"\napi_base = \"http://x\"\n[[routes]]\nmodel = \"m\"\n[[routes.targets]]\nprovider = \"\"\nweight = inf",
		`s.toml:7: routes[0].targets[0].provider: missing provider`,
		`s.toml:8: routes[0].targets[0].weight: weight must be > 0, got +Inf`)
	f("[metrics_scrape]\ninterval_secs = 0\ntimeout_secs = -1\npath = \"metrics\"",
		`s.toml:2: metrics_scrape.interval_secs: must be > 0, got 0`,
		`s.toml:3: metrics_scrape.timeout_secs: must be > 0, got -1`,
		`s.toml:4: metrics_scrape.path: path must start with '/', got "metrics"`)
	f("[health]\npath = \"\"\ninterval_secs = nan\nhealthy_threshold = 0\nmax_ejection_percent = 101",
		`s.toml:2: health.path: path must start with '/', got ""`,
		`s.toml:3: health.interval_secs: must be > 0, got NaN`,
		`s.toml:4: health.healthy_threshold: must be > 0, got 0`,
		`s.toml:5: health.max_ejection_percent: must be between 0 and 100, got 101`)
	f("[cooldown]\nfailures = 0\nbase_secs = 10\nmax_secs = 5\nconsecutive_5xx = -1",
		`s.toml:2: cooldown.failures: must be > 0, got 0`,
		`s.toml:4: cooldown.max_secs: max_secs (5) must be >= base_secs (10)`,
		`s.toml:5: cooldown.consecutive_5xx: must be > 0, got -1`)
	f("[breaker]\nfailures = 0\nopen_secs = 0\nhalf_open_probes = 0",
		`s.toml:2: breaker.failures: must be > 0, got 0`,
		`s.toml:3: breaker.open_secs: must be > 0, got 0`,
		`s.toml:4: breaker.half_open_probes: must be > 0, got 0`)
	f("[retry]\nmax_retries = 11\nbackoff_ms = -1\nmax_backoff_ms = -inf",
		`s.toml:2: retry.max_retries: must be between 0 and 10, got 11`,
		`s.toml:3: retry.backoff_ms: must be >= 0, got -1`,
		`s.toml:4: retry.max_backoff_ms: must be >= 0, got -Inf`)
	f("[timeouts]\nconnect_secs = 0\nheaders_secs = -1",
		`s.toml:2: timeouts.connect_secs: must be > 0, got 0`,
		`s.toml:3: timeouts.headers_secs: must be > 0, got -1`)
	f("[queue]\nmax_inflight = -1\nmax_waiting_per_target = -2\nwait_timeout_secs = -1\nretry_after_secs = 0",
		`s.toml:2: queue.max_inflight: must be >= 0, got -1`,
		`s.toml:3: queue.max_waiting_per_target: must be >= 0, got -2`,
		`s.toml:4: queue.wait_timeout_secs: must be >= 0, got -1`,
		`s.toml:5: queue.retry_after_secs: must be > 0, got 0`)
}

// TestValidateConfigSetsDefaults: a config built in code (as the engine's Reload gets it) gets the same
// per-element defaults as a decoded one, and values that are set are kept.
func TestValidateConfigSetsDefaults(t *testing.T) {
	three := 3.0
	cfg := Default()
	cfg.Providers = []ProviderConfig{
		{Name: "a", APIBase: "http://127.0.0.1:1", LMCache: &LMCacheConfig{Endpoint: "http://127.0.0.1:1/status"}},
		{Name: "b", APIBase: "http://127.0.0.1:2", MaxConns: 7, KVEvents: &KVEventsConfig{Endpoint: "tcp://127.0.0.1:5557"}},
	}
	cfg.Routes = []RouteConfig{{Model: "m", Targets: []TargetConfig{{Provider: "a"}, {Provider: "b", Model: "up", Weight: &three}}}}
	errs := Validate(cfg)
	if kvindex.Supported && len(errs) > 0 {
		t.Fatalf("unexpected errors: %s", errs)
	}
	if !kvindex.Supported && (len(errs) != 1 || errs[0].Key != "providers[1].kv_events") {
		t.Fatalf("want only the cgo error, got %v", errs)
	}
	f := func(name string, got, want any) {
		t.Helper()
		if got != want {
			t.Fatalf("%s: got %v, want %v", name, got, want)
		}
	}
	a, b, r := cfg.Providers[0], cfg.Providers[1], cfg.Routes[0]
	f("kind", a.Kind, kindOpenAICompatible)
	f("max_conns", a.MaxConns, defaultProviderMaxConns)
	f("max_conns set", b.MaxConns, 7)
	f("lmcache.refresh_secs", a.LMCache.RefreshSecs, defaultLMCacheRefreshSecs)
	f("lmcache.stale_secs", a.LMCache.StaleSecs, defaultLMCacheStaleSecs)
	f("kv_events.mode", b.KVEvents.Mode, "connect")
	f("kv_events.max_blocks", b.KVEvents.MaxBlocks, defaultKVMaxBlocks)
	f("kv_events.stale_secs", b.KVEvents.StaleSecs, defaultKVStaleSecs)
	f("strategy", r.Strategy, "round_robin")
	f("target model", r.Targets[0].Model, "m")
	f("target model set", r.Targets[1].Model, "up")
	f("weight", *r.Targets[0].Weight, 1.0)
	f("weight set", *r.Targets[1].Weight, 3.0)

	// Setting the defaults of a config that has them changes nothing.
	var b1, b2 strings.Builder
	if err := cfg.WriteTOML(&b1); err != nil {
		t.Fatal(err)
	}
	if again := Validate(cfg); len(again) != len(errs) {
		t.Fatalf("a second validation gives other errors: %v, then %v", errs, again)
	}
	if err := cfg.WriteTOML(&b2); err != nil {
		t.Fatal(err)
	}
	if b1.String() != b2.String() {
		t.Fatalf("setting defaults twice changed the config:\n%s\n---\n%s", b1.String(), b2.String())
	}
}

// TestValidateConfigWithoutFile: a config built in code is checked section by section like a file, every
// problem at once, with key paths and no file:line.
func TestValidateConfigWithoutFile(t *testing.T) {
	cfg := Default()
	cfg.Server.Listen = "nowhere"
	cfg.Health.Path = "health"
	cfg.Queue.RetryAfterSecs = 0
	cfg.Providers = []ProviderConfig{{Name: "a"}}
	cfg.Routes = []RouteConfig{{Model: "m", Strategy: "weighted", Targets: []TargetConfig{{Provider: "b"}}}}
	want := []string{
		`server.listen: cannot parse listen address "nowhere": want host:port`,
		`providers[0].api_base: missing URL`,
		`routes[0].targets[0].provider: unknown provider "b"`,
		`health.path: path must start with '/', got "health"`,
		`queue.retry_after_secs: must be > 0, got 0`,
	}
	errs := Validate(cfg)
	if len(errs) != len(want) {
		t.Fatalf("want %d errors, got %d:\n%s", len(want), len(errs), errs)
	}
	for i, w := range want {
		if got := errs[i].Error(); got != w {
			t.Fatalf("error %d: got %q, want %q", i, got, w)
		}
	}
}

// TestEffectiveConfigRoundTrips: `rolter check -print` prints every default, strategy parameters included,
// and what it prints loads back as the same config.
func TestEffectiveConfigRoundTrips(t *testing.T) {
	for _, path := range []string{"../configs/rolter.example.toml", "../configs/cache-aware.toml", "../configs/pipeline.toml"} {
		cfg, err := Load(path)
		if err != nil {
			if !kvindex.Supported && strings.Contains(err.Error(), "needs a build with cgo") {
				continue
			}
			t.Fatal(err)
		}
		eff := cfg.Effective()
		var b strings.Builder
		if err := eff.WriteTOML(&b); err != nil {
			t.Fatal(err)
		}
		text := b.String()
		for _, want := range []string{"max_body_bytes = 16777216", "[cooldown]", "consecutive_5xx = 5"} {
			if !strings.Contains(text, want) {
				t.Fatalf("%s: the effective config lacks %q:\n%s", path, want, text)
			}
		}
		again, err := Parse([]byte(text), "printed.toml")
		if err != nil {
			t.Fatalf("%s: the printed config does not load: %s\n%s", path, err, text)
		}
		again.File = eff.File
		var b2 strings.Builder
		if err := again.Effective().WriteTOML(&b2); err != nil {
			t.Fatal(err)
		}
		if b2.String() != text {
			t.Fatalf("%s: printing the printed config gives another config:\n%s\n---\n%s", path, text, b2.String())
		}
	}
	cfg, err := Parse([]byte(gatewayConfig("cache_aware", "", "http://127.0.0.1:1", "http://127.0.0.1:2")), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := cfg.Effective().WriteTOML(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"threshold = 0.5", "max_trie_nodes = 1000000", "max_trie_bytes = 107374182"} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("the effective cache_aware route lacks %q:\n%s", want, b.String())
		}
	}
}

// TestRouteTargetsDistinctProviders: the same provider twice in one route is refused at load (it used to
// pass and then crash the gateway on duplicate metric series).
func TestRouteTargetsDistinctProviders(t *testing.T) {
	text := gatewayConfig("round_robin", "[[routes.targets]]\nprovider = \"p0\"\nmodel = \"lora-adapter\"\n", "http://127.0.0.1:1")
	_, err := Parse([]byte(text), "t.toml")
	if err == nil || !strings.Contains(err.Error(), `routes[0].targets[1].provider: provider "p0" is already routes[0].targets[0]`) {
		t.Fatalf("got %v", err)
	}
}

// TestControlValidation: [control]'s connection cap, timeouts and host names, and that a reload changing
// any of them is refused (the control plane's listener is made once, at start).
func TestControlValidation(t *testing.T) {
	f := func(ctl, want string) {
		t.Helper()
		_, err := Parse([]byte("[control]\nenabled = false\n"+ctl), "ctl.toml")
		if want == "" {
			if err != nil {
				t.Fatalf("%q: unexpected error: %s", ctl, err)
			}
			return
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%q: got %v, want %q", ctl, err, want)
		}
	}
	f(`hosts = ["rolter.example.com", "gw:8443", "10.0.0.5", "[fd00::1]:8081"]`, "")
	f("max_conns = 1\nread_timeout_secs = 0.5", "")
	f(`hosts = ["http://evil.example"]`, `ctl.toml:3: control.hosts: cannot use "http://evil.example"`)
	f(`hosts = ["a..b"]`, `control.hosts: cannot use "a..b"`)
	f(`hosts = ["gw:0"]`, `control.hosts: cannot use "gw:0"`)
	f(`max_conns = 0`, "ctl.toml:3: control.max_conns: must be between 1 and 65536, got 0")
	f(`read_timeout_secs = 0`, "control.read_timeout_secs: must be > 0, got 0")
	f(`write_timeout_secs = -1`, "control.write_timeout_secs: must be > 0, got -1")
	f(`idle_timeout_secs = 0`, "control.idle_timeout_secs: must be > 0, got 0")

	a, b := Default().Control, Default().Control
	if !a.Equal(&b) {
		t.Fatal("the default [control] differs from itself")
	}
	b.Hosts = []string{"gw"}
	if a.Equal(&b) {
		t.Fatal("[control] hosts changed but equal reports no change")
	}
	b = a
	b.MaxConns++
	if a.Equal(&b) {
		t.Fatal("[control] max_conns changed but equal reports no change")
	}
}

// TestControlWithoutEnabled: a [control] table that does not say enabled is refused rather than silently
// off; enabled = false keeps it off on purpose.
func TestControlWithoutEnabled(t *testing.T) {
	_, err := Parse([]byte("[server]\nlisten = \"127.0.0.1:8080\"\n\n[control]\nlisten = \"127.0.0.1:9090\"\n"), "t.toml")
	var errs Errors
	if !errors.As(err, &errs) || len(errs) != 1 || errs[0].Key != "control.enabled" || errs[0].Line != 4 ||
		!strings.Contains(errs[0].Msg, "enabled = true") {
		t.Fatalf("[control] without enabled: %v", err)
	}
	if _, err := Parse([]byte("[control]\nenabled = false\nlisten = \"127.0.0.1:9090\"\n"), "t.toml"); err != nil {
		t.Fatalf("[control] enabled = false: %v", err)
	}
}

// TestDocsBaseURL: [docs] base_url takes a path on the control plane or an http(s) address.
func TestDocsBaseURL(t *testing.T) {
	f := func(base string, ok bool) {
		t.Helper()
		_, err := Parse([]byte("[docs]\nbase_url = \""+base+"\"\n"), "docs.toml")
		if (err == nil) != ok {
			t.Fatalf("base_url %q: got %v, want ok %v", base, err, ok)
		}
		if !ok && !strings.Contains(err.Error(), "docs.toml:2: docs.base_url") {
			t.Fatalf("base_url %q: got %v, want the key and line", base, err)
		}
	}
	f("", true)
	f("/docs", true)
	f("/manual/v2/", true)
	f("https://docs.rolter.test/v1", true)
	f("//evil.test/docs", false)
	f("/docs/../admin", false)
	f("/docs?x=1", false)
	f("docs", false)
	f("ftp://docs.rolter.test", false)
}
