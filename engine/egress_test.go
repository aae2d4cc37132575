package engine

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
)

// TestEgressRefusesMetadataEverywhere: the default policy refuses 169.254.169.254 for every kind of
// endpoint at config load, each with file:line, its key and the rule.
func TestEgressRefusesMetadataEverywhere(t *testing.T) {
	text := `[[providers]]
name = "a"
api_base = "http://169.254.169.254/v1"
[providers.kv_events]
endpoint = "tcp://169.254.169.254:5557"
replay_endpoint = "tcp://169.254.169.254:5558"
[providers.lmcache]
endpoint = "http://169.254.169.254/status"
[[providers]]
name = "b"
api_base = "http://[fe80::a9fe:a9fe]:8000"
[[routes]]
model = "m"
[[routes.targets]]
provider = "a"
`
	_, err := config.Parse([]byte(text), "egress.toml")
	if err == nil {
		t.Fatal("a config pointing at the metadata address loaded")
	}
	msg := err.Error()
	for _, want := range []string{
		"egress.toml:3: providers[0].api_base: egress policy refuses 169.254.169.254: block_link_local",
		"egress.toml:5: providers[0].kv_events.endpoint: egress policy refuses 169.254.169.254: block_link_local",
		"egress.toml:6: providers[0].kv_events.replay_endpoint: egress policy refuses 169.254.169.254: block_link_local",
		"egress.toml:8: providers[0].lmcache.endpoint: egress policy refuses 169.254.169.254: block_link_local",
		"egress.toml:11: providers[1].api_base: egress policy refuses fe80::a9fe:a9fe: block_link_local",
	} {
		if !strings.Contains(msg, want) {
			t.Fatalf("missing %q in:\n%s", want, msg)
		}
	}
}

// TestEgressConfigRules: the [egress] lists, as the config sees them before any DNS lookup.
func TestEgressConfigRules(t *testing.T) {
	f := func(egress, apiBase, want string) {
		t.Helper()
		text := "[egress]\n" + egress + "\n[[providers]]\nname = \"a\"\napi_base = \"" + apiBase + "\"\n[[routes]]\nmodel = \"m\"\n[[routes.targets]]\nprovider = \"a\"\n"
		_, err := config.Parse([]byte(text), "e.toml")
		switch {
		case want == "" && err != nil:
			t.Fatalf("[egress] %s, %s: %s", egress, apiBase, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Fatalf("[egress] %s, %s: %v, want %q", egress, apiBase, err, want)
		}
	}
	f(`block_private = true`, "http://10.0.0.5:8000", "block_private")
	f("block_private = true\nallow_cidrs = [\"10.0.0.0/24\"]", "http://10.0.0.5:8000", "")
	f("allow_cidrs = [\"10.0.0.0/8\"]\ndeny_cidrs = [\"10.0.0.5\"]", "http://10.0.0.5:8000", "deny_cidrs 10.0.0.5/32")
	f(`deny_hosts = ["*.internal"]`, "http://admin.internal:9000", "deny_hosts *.internal")
	f("deny_hosts = [\"admin.internal\"]\nallow_hosts = [\"admin.internal\"]", "http://admin.internal", "deny_hosts admin.internal")
	f(`block_loopback = true`, "http://127.0.0.1:8000", "block_loopback")
	f(`block_loopback = true`, "http://0.0.0.0:8000", "block_loopback")
	f(`block_link_local = false`, "http://169.254.169.254", "block_metadata") // the metadata address stays refused
	f("block_link_local = false\nblock_metadata = false", "http://169.254.169.254", "")
	f(`allow_cidrs = ["10.0.0.0/33"]`, "http://10.0.0.5", `e.toml:2: egress.allow_cidrs: cannot use allow_cidrs entry "10.0.0.0/33"`)
}

// swapResolver is a DNS the test changes between lookups.
type swapResolver struct {
	mu    sync.Mutex
	addrs map[string]string
}

func (r *swapResolver) set(host, addr string) {
	r.mu.Lock()
	r.addrs[host] = addr
	r.mu.Unlock()
}

func (r *swapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.addrs[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return []netip.Addr{netip.MustParseAddr(a)}, nil
}

// TestEgressProxyRebinding: a provider whose name starts resolving to a refused address is refused with a
// clear 502, nothing is sent there, and the refusal is counted.
func TestEgressProxyRebinding(t *testing.T) {
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close") // every request dials (and so resolves) again
		okJSON(w, r)
	})
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(up.URL, "http://"))
	res := &swapResolver{addrs: map[string]string{"engine.test": "127.0.0.1"}}
	gw := startGatewayWith(t, gatewayConfig("round_robin", "[retry]\nmax_retries = 0\n", "http://engine.test:"+port), Options{Resolver: res})
	if resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false)); resp.StatusCode != 200 {
		t.Fatalf("allowed name: %d %s", resp.StatusCode, got)
	}
	sent := up.requests.Load()
	res.set("engine.test", "169.254.169.254")
	resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
	if resp.StatusCode != 502 {
		t.Fatalf("rebound name: %d %s, want 502", resp.StatusCode, got)
	}
	if e := assertOpenAIError(t, got, "upstream_error"); !strings.Contains(e.Message, "egress policy") {
		t.Fatalf("message %q does not say the egress policy refused it", e.Message)
	}
	if up.requests.Load() != sent {
		t.Fatal("a request reached the upstream after its name was refused")
	}
	if m := metricsText(t, gw); !strings.Contains(m, `rolter_egress_refused_total{use="proxy"} 1`) {
		t.Fatalf("refusal not counted:\n%s", grepLines(m, "egress"))
	}
}

// TestEgressLMCacheEveryRefresh: the LMCache poll is checked on every refresh: a name that starts resolving
// to a refused address is refused on the next poll, and the source turns stale (neutral).
func TestEgressLMCacheEveryRefresh(t *testing.T) {
	status := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"occupancy":0.3,"cache_available":true}`)
	})}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go status.Serve(ln)
	t.Cleanup(func() { status.Close() })
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	up := newFakeUpstream(t, okJSON)
	res := &swapResolver{addrs: map[string]string{"lmcache.test": "127.0.0.1"}}
	cfg := strings.Replace(gatewayConfig("lmcache_aware", "", up.URL), "[[routes]]", fmt.Sprintf("[providers.lmcache]\nendpoint = \"http://lmcache.test:%s/status\"\nrefresh_secs = 0.05\nstale_secs = 5\n[[routes]]", port), 1)
	gw := startGatewayWith(t, cfg, Options{Resolver: res})
	p := gw.g.Snapshot().Providers[0]
	waitFor(t, 3*time.Second, "a first LMCache status", func() bool {
		_, _, ok := p.lmcache.get(time.Now().UnixNano())
		return ok
	})
	res.set("lmcache.test", "169.254.169.254")
	waitFor(t, 3*time.Second, "the source to turn neutral after the refused refresh", func() bool {
		_, _, ok := p.lmcache.get(time.Now().UnixNano())
		return !ok
	})
	if m := metricsText(t, gw); !strings.Contains(m, `rolter_egress_refused_total{use="lmcache"}`) {
		t.Fatalf("refusal not counted:\n%s", grepLines(m, "egress"))
	}
	if st := p.lmcache.poller.Stats(); st.LastError == nil || !strings.Contains(st.LastError.Error(), "block_link_local") {
		t.Fatalf("the poll error does not name the rule: %v", st.LastError)
	}
}
