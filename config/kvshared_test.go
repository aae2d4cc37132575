package config

import (
	"strings"
	"testing"
)

// TestKVEventsSharedBindValidation: providers whose kv_events bind one endpoint share one socket, so each
// needs a distinct non-empty topic and the same publisher policy; every problem is reported on the later
// provider's key and line (without these checks, four providers binding one address passed `rolter check`,
// then three retried "address already in use" forever).
func TestKVEventsSharedBindValidation(t *testing.T) {
	provider := func(name, kv string) string {
		return "[[providers]]\nname = \"" + name + "\"\napi_base = \"http://127.0.0.1:1\"\n[providers.kv_events]\nmode = \"bind\"\n" + kv
	}
	f := func(src string, want ...string) {
		t.Helper()
		_, err := Parse([]byte(src), "kv.toml")
		for _, w := range want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Fatalf("got %v, want %q", err, w)
			}
		}
		if len(want) == 0 && err != nil && !strings.Contains(err.Error(), "needs a build with cgo") {
			t.Fatalf("got %v, want no error", err)
		}
	}
	const ep = "endpoint = \"tcp://127.0.0.1:5557\"\n"
	// Four engines on one endpoint, each with its topic (llm-d style).
	f(provider("a", ep+"topic = \"kv@10.0.0.1\"\n") + provider("b", ep+"topic = \"kv@10.0.0.2\"\n") +
		provider("c", ep+"topic = \"kv@10.0.0.3\"\n") + provider("d", ep+"topic = \"kv@10.0.0.4\"\n"))
	// Lines: provider a's table is at 4, its endpoint at 6; each provider takes 6 or 7 lines.
	f(provider("a", ep)+provider("b", ep+"topic = \"kv@b\"\n"),
		`kv.toml:4: providers[0].kv_events.topic: empty topic on bind endpoint "tcp://127.0.0.1:5557", which other providers share`,
		`(also providers[1], "b")`, `--kv-events-config '{"topic": "..."}'`)
	f(provider("a", ep+"topic = \"kv@a\"\n")+provider("b", ep+"topic = \"kv@a\"\n"),
		`kv.toml:14: providers[1].kv_events.topic: topic "kv@a" is already taken on bind endpoint "tcp://127.0.0.1:5557"`,
		`(also providers[0], "a")`)
	f(provider("a", ep+"topic = \"kv@a\"\nallowed_publishers = [\"10.0.0.1\"]\n")+provider("b", ep+"topic = \"kv@b\"\n"),
		`kv.toml:12: providers[1].kv_events.allowed_publishers: allowed_publishers differs on shared bind endpoint`)
	f(provider("a", "endpoint = \"tcp://*:5557\"\ntopic = \"kv@a\"\n")+provider("b", ep+"topic = \"kv@b\"\n"),
		`kv.toml:13: providers[1].kv_events.endpoint: endpoint "tcp://127.0.0.1:5557" binds the port of "tcp://*:5557"`)
}
