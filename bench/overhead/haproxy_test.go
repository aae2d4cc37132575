package overhead

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/internal/haproxytest"
)

// TestHAProxyConfig: the template renders a case's config line for line (the small case in full), with
// one server per target, and HAProxy accepts every case's config when it is installed.
func TestHAProxyConfig(t *testing.T) {
	cases := NewCases(&Options{Strategy: "round_robin", CacheTargets: 4, PromptBytes: 8192})
	text, err := haproxyConfig(cases[0], "127.0.0.1:18082", "127.0.0.1:18081", "/run/h.pid")
	if err != nil {
		t.Fatal(err)
	}
	const small = `# overhead report, case small: a null proxy in front of the fake upstream
global
    maxconn 4096
    pidfile /run/h.pid

defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
    http-reuse always
    # Forward each SSE chunk as it comes instead of waiting to merge it with more data (without it
    # the first chunk of a stream waited ~200 ms here): what an operator proxying LLM streams sets.
    option http-no-delay

frontend fe
    bind 127.0.0.1:18082
    default_backend be

backend be
    balance roundrobin
    server s1 127.0.0.1:18081
`
	if text != small {
		t.Fatalf("small case config:\n%s\nwant:\n%s", text, small)
	}

	f := func(c *Case, wantLines ...string) {
		t.Helper()
		text, err := haproxyConfig(c, "127.0.0.1:18082", "127.0.0.1:18081", filepath.Join(t.TempDir(), "h.pid"))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range wantLines {
			if !strings.Contains(text, "\n"+l+"\n") {
				t.Fatalf("%s: no line %q in:\n%s", c.Name, l, text)
			}
		}
		if n := strings.Count(text, "\n    server "); n != c.Targets {
			t.Fatalf("%s: %d servers, want %d:\n%s", c.Name, n, c.Targets, text)
		}
		if !strings.HasSuffix(text, fmt.Sprintf("    server s%d 127.0.0.1:18081\n", c.Targets)) {
			t.Fatalf("%s: the config does not end on its last server:\n%q", c.Name, text)
		}
		haproxytest.Check(t, text)
	}
	f(cases[0], "    mode http", "    bind 127.0.0.1:18082", "    server s1 127.0.0.1:18081")
	f(cases[1], "    http-reuse always", "    option http-no-delay", "    balance roundrobin",
		"    server s1 127.0.0.1:18081", "    server s4 127.0.0.1:18081")
}
