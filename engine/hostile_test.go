package engine

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/kvindex"
)

// smuggle is a header value that ends its header and the request, and starts a second request to an
// engine path the data plane refuses.
const smuggle = "x\r\n\r\nPOST /v1/load_lora_adapter HTTP/1.1\r\nHost: engine\r\nContent-Length: 2\r\n\r\n{}"

// TestHeaderValuesAreFieldValues: a provider header value with CR, LF, NUL or another control character,
// or with whitespace at either end, is refused at load with file:line and the key, without echoing the
// value (it may be a credential); tabs and spaces inside and obs-text are RFC 9110 field values.
func TestHeaderValuesAreFieldValues(t *testing.T) {
	f := func(value, want string) {
		t.Helper()
		text := fmt.Sprintf("[[providers]]\nname = \"a\"\napi_base = \"http://127.0.0.1:9\"\n[providers.headers]\nX-Evil = %q\n"+
			"[[routes]]\nmodel = \"m\"\n[[routes.targets]]\nprovider = \"a\"\n", value)
		_, err := config.Parse([]byte(text), "h.toml")
		switch {
		case want == "" && err != nil:
			t.Fatalf("%q refused: %s", value, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Fatalf("%q: %v, want %q", value, err, want)
		case err != nil && strings.Contains(err.Error(), "load_lora"):
			t.Fatalf("the error echoes the value: %s", err)
		}
	}
	f(smuggle, `h.toml:4: providers[0].headers: invalid value of header "X-Evil": it holds a control character (0x0d) at byte 1`)
	f("a\nb", "control character (0x0a) at byte 1")
	f("a\x00b", "control character (0x00) at byte 1")
	f("a\x7fb", "control character (0x7f)")
	f(" a", "starts or ends with whitespace")
	f("a\t", "starts or ends with whitespace")
	f("Bearer a\tb c", "")
	f("caf\u00e9", "")
	f("", "")
}

// TestOwnListenersRefused: an endpoint the gateway dials that is one of its own listeners - [server]
// listen, and [control] listen when it is on - is refused at load, by IP literal, localhost or an
// unspecified address; other ports, and a listener on port 0, are not.
func TestOwnListenersRefused(t *testing.T) {
	f := func(server, control, apiBase, lmcache, kv, want string) {
		t.Helper()
		text := fmt.Sprintf("[server]\nlisten = %q\n", server)
		if control != "" {
			text += fmt.Sprintf("[control]\nenabled = true\nlisten = %q\n", control)
		}
		text += fmt.Sprintf("[[providers]]\nname = \"a\"\napi_base = %q\n", apiBase)
		if lmcache != "" {
			text += fmt.Sprintf("[providers.lmcache]\nendpoint = %q\n", lmcache)
		}
		if kv != "" {
			text += fmt.Sprintf("[providers.kv_events]\nendpoint = %q\n", kv)
		}
		text += "[[routes]]\nmodel = \"m\"\n[[routes.targets]]\nprovider = \"a\"\n"
		_, err := config.Parse([]byte(text), "s.toml")
		switch {
		case want == "" && err != nil:
			t.Fatalf("%s -> %s: %s", server, apiBase, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Fatalf("%s -> %s %s %s: %v, want %q", server, apiBase, lmcache, kv, err, want)
		}
	}
	own := `it is the gateway's own listener (server.listen "127.0.0.1:18080")`
	f("127.0.0.1:18080", "", "http://127.0.0.1:18080/v1", "", "", `s.toml:5: providers[0].api_base: cannot use "http://127.0.0.1:18080/v1": `+own)
	f("127.0.0.1:18080", "", "http://localhost:18080", "", "", own)
	f("127.0.0.1:18080", "", "http://[::ffff:127.0.0.1]:18080", "", "", own)
	f("127.0.0.1:18080", "", "http://0.0.0.0:18080", "", "", own)
	f(":18080", "", "http://127.0.0.2:18080", "", "", `server.listen ":18080"`)
	f(":18080", "", "http://[::1]:18080", "", "", `server.listen ":18080"`)
	f("127.0.0.1:80", "", "http://127.0.0.1", "", "", `server.listen "127.0.0.1:80"`) // the scheme's port
	f("127.0.0.1:18080", "", "http://127.0.0.1:18082", "http://127.0.0.1:18080/lmcache", "",
		`providers[0].lmcache.endpoint: cannot use "http://127.0.0.1:18080/lmcache"`)
	f("127.0.0.1:18080", "127.0.0.1:18081", "http://localhost:18081", "", "", `control.listen "127.0.0.1:18081"`)
	if kvindex.Supported {
		f("127.0.0.1:18080", "", "http://127.0.0.1:18082", "", "tcp://127.0.0.1:18080", `providers[0].kv_events.endpoint: cannot use "tcp://127.0.0.1:18080"`)
	}
	f("127.0.0.1:18080", "", "http://127.0.0.1:18082", "", "", "")   // another port
	f("127.0.0.1:0", "", "http://127.0.0.1:18080", "", "", "")       // a port picked at start is unknown here
	f("10.0.0.5:18080", "", "http://127.0.0.1:18080", "", "", "")    // a listener on one address only
	f("127.0.0.1:18080", "", "http://engine.test:18080", "", "", "") // names are not resolved: the hop header's
	f("127.0.0.1:18080", "127.0.0.1:18081", "http://127.0.0.1:18083", "", "", "")
	// [control] off: its listen address is no listener.
	text := "[server]\nlisten = \"127.0.0.1:18080\"\n[control]\nenabled = false\nlisten = \"127.0.0.1:18081\"\n[[providers]]\nname = \"a\"\napi_base = \"http://127.0.0.1:18081\"\n[[routes]]\nmodel = \"m\"\n[[routes.targets]]\nprovider = \"a\"\n"
	if _, err := config.Parse([]byte(text), "s.toml"); err != nil {
		t.Fatalf("[control] off: %s", err)
	}
}

// startSelfLoop starts a gateway whose route "loop" has a provider reaching the gateway itself under a name
// the config check cannot resolve (engine.test, which the test's DNS points at the gateway's loopback
// address), and whose route "ok" goes to an upstream that answers at once.
func startSelfLoop(t *testing.T) (gw *testGateway, ok *fakeUpstream) {
	t.Helper()
	ok = newFakeUpstream(t, okJSON)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	text := fmt.Sprintf(`[server]
listen = "127.0.0.1:0"
[retry]
max_retries = 0
[[providers]]
name = "self"
api_base = "http://engine.test:%s"
[[providers]]
name = "ok"
api_base = %q
[[routes]]
model = "loop"
[[routes.targets]]
provider = "self"
[[routes]]
model = "ok"
[[routes.targets]]
provider = "ok"
`, port, ok.URL)
	cfg, err := config.Parse([]byte(text), "loop.toml")
	if err != nil {
		t.Fatal(err)
	}
	res := &swapResolver{addrs: map[string]string{"engine.test": "127.0.0.1"}}
	log := quietLog()
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	g, err := New(cfg, Options{Logger: log, Version: "test", Resolver: res})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(ln)
	}()
	t.Cleanup(func() {
		ctx, cancel := contextWithTimeout(5 * time.Second)
		defer cancel()
		_ = g.Shutdown(ctx)
		<-done
	})
	return &testGateway{g: g, URL: "http://" + ln.Addr().String(), addr: ln.Addr().String()}, ok
}

// timeRequests sends n requests to route "ok" one after another and returns how long they took.
func timeRequests(t *testing.T, url string, n int) time.Duration {
	t.Helper()
	start := time.Now()
	for range n {
		if resp, body := post(t, url+"/v1/chat/completions", chatBody("ok", "hi", false)); resp.StatusCode != 200 {
			t.Errorf("route ok: %d %s", resp.StatusCode, body)
		}
	}
	return time.Since(start)
}

// TestSelfLoopEndsAt508: a provider that reaches the gateway itself (the config check bypassed by a name
// it cannot resolve) costs one extra request: the gateway sees its own id in X-Rolter-Hop and answers 508
// loop_detected at once, where before the request recursed until the connection cap while other clients
// waited. Timings are bounded by ratios to the same gateway's plain requests.
func TestSelfLoopEndsAt508(t *testing.T) {
	gw, ok := startSelfLoop(t)
	const n = 50
	timeRequests(t, gw.URL, 5) // warm the connections, the loop's too
	post(t, gw.URL+"/v1/chat/completions", chatBody("loop", "hi", false))
	base := timeRequests(t, gw.URL, n)

	loopDone := make(chan time.Duration, 1)
	var status int
	var body string
	go func() {
		start := time.Now()
		resp, b := post(t, gw.URL+"/v1/chat/completions", chatBody("loop", "hi", false))
		status, body = resp.StatusCode, b
		loopDone <- time.Since(start)
	}()
	during := timeRequests(t, gw.URL, n)
	loop := <-loopDone
	if status != http.StatusLoopDetected || !strings.Contains(body, "loop_detected") {
		t.Fatalf("loop: %d %s, want 508 loop_detected", status, body)
	}
	// The loop costs about two plain requests (the request and its return); n plain ones are the bound.
	if loop > base {
		t.Fatalf("the loop took %v, longer than %d plain requests (%v)", loop, n, base)
	}
	if during > 10*base {
		t.Fatalf("%d requests took %v beside the loop, %v without", n, during, base)
	}
	if got := ok.requests.Load(); got != 2*n+5 {
		t.Fatalf("the ok upstream served %d requests, want %d", got, 2*n+5)
	}
}

// TestHopChain: distinct gateways in a chain forward each other's requests, each adding its id to
// X-Rolter-Hop; a request that carries a gateway's own id, or that has passed too many gateways, is
// answered 508 before anything is sent upstream.
func TestHopChain(t *testing.T) {
	var hops []string
	var mu sync.Mutex
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hops = append(hops, r.Header.Get("X-Rolter-Hop"))
		mu.Unlock()
		okJSON(w, r)
	})
	b := startGateway(t, gatewayConfig("round_robin", "", up.URL))
	a := startGateway(t, strings.Replace(gatewayConfig("round_robin", "", b.URL), `model = "up-model"`, `model = "m"`, 1))
	if resp, body := post(t, a.URL+"/v1/chat/completions", chatBody("m", "hi", false)); resp.StatusCode != 200 {
		t.Fatalf("chain: %d %s", resp.StatusCode, body)
	}
	mu.Lock()
	got := hops
	mu.Unlock()
	if want := a.g.hopID + ", " + b.g.hopID; len(got) != 1 || got[0] != want {
		t.Fatalf("the engine saw X-Rolter-Hop %q, want %q", got, want)
	}
	// A client's own hop list goes on (the chain it came through), and the gateway's id joins it.
	if resp, _ := post(t, b.URL+"/v1/chat/completions", chatBody("m", "hi", false), "X-Rolter-Hop", "0123456789abcdef"); resp.StatusCode != 200 {
		t.Fatalf("foreign hop: %d", resp.StatusCode)
	}
	f := func(hop string) {
		t.Helper()
		before := up.requests.Load()
		resp, body := post(t, b.URL+"/v1/chat/completions", chatBody("m", "hi", false), "X-Rolter-Hop", hop)
		if resp.StatusCode != http.StatusLoopDetected || !strings.Contains(body, `"code":"loop_detected"`) ||
			!strings.Contains(body, `"type":"server_error"`) {
			t.Fatalf("hop %q: %d %s, want 508 loop_detected", hop, resp.StatusCode, body)
		}
		if up.requests.Load() != before {
			t.Fatalf("hop %q reached the engine", hop)
		}
	}
	f(b.g.hopID)
	f("aaaa, " + b.g.hopID + ", cccc")
	f(strings.Repeat("x, ", maxHops-1) + "x")
}

// TestOrgKVEndpoints: an org's provider (one the control plane made) cannot name ipc:// or inproc://
// KV-event endpoints, and binds only on a port [egress] kv_bind_ports lists; the file's providers can do
// both.
func TestOrgKVEndpoints(t *testing.T) {
	if !kvindex.Supported {
		t.Skip("kv_events needs cgo")
	}
	f := func(org string, kv config.KVEventsConfig, bindPorts []int, want string) {
		t.Helper()
		cfg := config.Default()
		cfg.Egress.KVBindPorts = bindPorts
		cfg.Providers = []config.ProviderConfig{{Org: org, Name: "p", APIBase: "http://127.0.0.1:9", KVEvents: &kv}}
		errs := config.Validate(cfg)
		switch {
		case want == "" && len(errs) > 0:
			t.Fatalf("org %q %+v: %s", org, kv, errs)
		case want != "" && (len(errs) == 0 || !strings.Contains(errs.Error(), want)):
			t.Fatalf("org %q %+v: %v, want %q", org, kv, errs, want)
		}
	}
	f("org_a", config.KVEventsConfig{Endpoint: "ipc:///tmp/engine.sock"}, nil, `providers[0].kv_events.endpoint: cannot use "ipc:///tmp/engine.sock": an org's provider takes tcp:// endpoints only`)
	f("org_a", config.KVEventsConfig{Endpoint: "inproc://kv"}, nil, `cannot use "inproc://kv"`)
	f("org_a", config.KVEventsConfig{Endpoint: "tcp://127.0.0.1:5557", ReplayEndpoint: "ipc:///tmp/replay"}, nil, `providers[0].kv_events.replay_endpoint: cannot use "ipc:///tmp/replay"`)
	f("org_a", config.KVEventsConfig{Endpoint: "tcp://*:5557", Mode: "bind"}, nil, `providers[0].kv_events.endpoint: cannot bind "tcp://*:5557": an org's provider binds only on a port [egress] kv_bind_ports lists`)
	f("org_a", config.KVEventsConfig{Endpoint: "tcp://*:5557", Mode: "bind"}, []int{5558}, `cannot bind "tcp://*:5557"`)
	f("org_a", config.KVEventsConfig{Endpoint: "tcp://*:5557", Mode: "bind"}, []int{5557}, "")
	f("org_a", config.KVEventsConfig{Endpoint: "tcp://127.0.0.1:5557"}, nil, "")
	f("", config.KVEventsConfig{Endpoint: "ipc:///tmp/engine.sock"}, nil, "")
	f("", config.KVEventsConfig{Endpoint: "tcp://*:5557", Mode: "bind"}, nil, "")
	cfg := config.Default()
	cfg.Egress.KVBindPorts = []int{0}
	if errs := config.Validate(cfg); !strings.Contains(errs.Error(), "kv_bind_ports entry 0") {
		t.Fatalf("kv_bind_ports = [0]: %v", errs)
	}
}

// TestKVBindInUseRefused: a config whose KV-event bind endpoint another listener holds (here the
// gateway's own data-plane port) is refused when it is applied, at start and by reload, and the running
// config keeps serving; before, it was accepted and the bind retried forever.
func TestKVBindInUseRefused(t *testing.T) {
	if !kvindex.Supported {
		t.Skip("kv_events needs cgo")
	}
	up := newFakeUpstream(t, okJSON)
	gw := startGateway(t, gatewayConfig("round_robin", "", up.URL))
	// A provider of its own name: the reload replaces p0 rather than changing it.
	text := fmt.Sprintf(`[server]
listen = "127.0.0.1:0"
[[providers]]
name = "pk"
api_base = %q
[providers.kv_events]
endpoint = "tcp://%s"
mode = "bind"
[[routes]]
model = "m"
strategy = "precise_cache_aware"
[[routes.targets]]
provider = "pk"
`, up.URL, gw.addr)
	cfg, err := config.Parse([]byte(text), "bind.toml")
	if err != nil {
		t.Fatalf("bad test config: %s\n%s", err, text)
	}
	if _, err := New(cfg, Options{Logger: quietLog()}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("New: %v, want the bind refused as in use", err)
	}
	if err := gw.g.Reload(cfg); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("Reload: %v, want the bind refused as in use", err)
	}
	if resp, body := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "hi", false)); resp.StatusCode != 200 {
		t.Fatalf("the running config stopped serving: %d %s", resp.StatusCode, body)
	}
}
