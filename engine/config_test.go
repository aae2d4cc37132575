package engine

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
	cfg, err := ParseConfig([]byte(goodConfig), "good.toml")
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
	cfg, err := ParseConfig([]byte(s), "x.toml")
	if err != nil {
		t.Fatalf("unexpected error: %s", err)
	}
	return cfg
}

// TestParseConfigErrors pins that every problem is reported, each with its file:line and key.
func TestParseConfigErrors(t *testing.T) {
	f := func(src string, want ...string) {
		t.Helper()
		_, err := ParseConfig([]byte(src), "bad.toml")
		if err == nil {
			t.Fatalf("expected errors for:\n%s", src)
		}
		var ce ConfigErrors
		if !errors.As(err, &ce) {
			t.Fatalf("want ConfigErrors, got %T: %s", err, err)
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
	if _, err := LoadConfig(path); err != nil {
		t.Fatalf("unexpected error: %s", err)
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.toml")); err == nil || !strings.Contains(err.Error(), "cannot read config") {
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
	_, err := ParseConfig([]byte(src), "kv.toml")
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
	_, err := ParseConfig([]byte(src), "kv.toml")
	if err == nil || !strings.Contains(err.Error(), `kv.toml:8: routes[0].targets[0].provider: strategy "precise_cache_aware" needs [providers.kv_events] on provider "a"`) {
		t.Fatalf("got %v", err)
	}
}

// TestKVEventsValidation: kv_events values the subscriber would refuse are refused by the config already.
func TestKVEventsValidation(t *testing.T) {
	if !kvindex.Supported {
		t.Skip("kv_events needs cgo")
	}
	f := func(kv, want string) {
		t.Helper()
		src := "[[providers]]\nname = \"a\"\napi_base = \"http://127.0.0.1:1\"\n[providers.kv_events]\n" + kv
		_, err := ParseConfig([]byte(src), "kv.toml")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%q: got %v, want %q", kv, err, want)
		}
	}
	f("endpoint = \"tcp://127.0.0.1\"", "kv.toml:5: providers[0].kv_events.endpoint")
	f("endpoint = \"udp://x:1\"", "want tcp://, ipc:// or inproc://")
	f("endpoint = \"tcp://x:1\"\nreplay_endpoint = \"tcp://\"", "kv.toml:6: providers[0].kv_events.replay_endpoint")
	f("endpoint = \"tcp://x:1\"\nmax_blocks = 99999999", "kv.toml:6: providers[0].kv_events.max_blocks: must be between 1 and")
	f("endpoint = \"tcp://x:1\"\nmode = \"pull\"", "kv.toml:6: providers[0].kv_events.mode")
}

// TestEffectiveConfigRoundTrips: `rolter check -print` prints every default, strategy parameters included,
// and what it prints loads back as the same config.
func TestEffectiveConfigRoundTrips(t *testing.T) {
	for _, path := range []string{"../configs/rolter.example.toml", "../configs/cache-aware.toml", "../configs/pipeline.toml"} {
		cfg, err := LoadConfig(path)
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
		again, err := ParseConfig([]byte(text), "printed.toml")
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
	cfg, err := ParseConfig([]byte(gatewayConfig("cache_aware", "", "http://127.0.0.1:1", "http://127.0.0.1:2")), "t.toml")
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
