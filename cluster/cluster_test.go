package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/rolter-ai/rolter/cluster"
	"github.com/rolter-ai/rolter/cluster/natstest"
	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/egress"
	"github.com/rolter-ai/rolter/engine"
)

// The tests run real gateways (engine.New, on loopback) against fake OpenAI-compatible upstreams, joined by
// a real nats-server (natstest). Nothing asserts a duration: every wait polls with a generous deadline.

func testLog(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// waitFor polls cond until it holds, failing the test after 20 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// upstream is a fake engine answering every POST with a chat completion. While held, it keeps requests
// waiting until release.
type upstream struct {
	srv      *httptest.Server
	requests atomic.Int64
	waiting  atomic.Int64
	mu       sync.Mutex
	hold     chan struct{} // nil: answer at once
}

func newUpstream(t testing.TB) *upstream {
	u := &upstream{}
	u.srv = httptest.NewServer(u)
	t.Cleanup(func() {
		u.release()
		u.srv.Close()
	})
	return u
}

func (u *upstream) URL() string { return u.srv.URL }

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.requests.Add(1)
	_, _ = io.Copy(io.Discard, r.Body)
	u.mu.Lock()
	hold := u.hold
	u.mu.Unlock()
	if hold != nil {
		u.waiting.Add(1)
		select {
		case <-hold:
		case <-r.Context().Done():
		}
		u.waiting.Add(-1)
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","model":"up-model","choices":[{"index":0,`+
		`"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],`+
		`"usage":{"prompt_tokens":100,"completion_tokens":1,"total_tokens":101}}`)
}

// holdRequests makes later requests wait until release.
func (u *upstream) holdRequests() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.hold == nil {
		u.hold = make(chan struct{})
	}
}

func (u *upstream) release() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.hold != nil {
		close(u.hold)
		u.hold = nil
	}
}

// gateway is an engine.Gateway serving on loopback, with its cluster when it has one.
type gateway struct {
	g   *engine.Gateway
	cfg *config.Config
	url string
	c   *cluster.Cluster
}

// startGateway starts a gateway from a TOML config; it is shut down at cleanup.
func startGateway(t testing.TB, cfgText string) *gateway { return startGatewayWith(t, cfgText, nil) }

// startGatewayWith is startGateway with the parsed config changed by edit first (what only the control
// plane sets: keys, their limits).
func startGatewayWith(t testing.TB, cfgText string, edit func(*config.Config)) *gateway {
	t.Helper()
	cfg, err := config.Parse([]byte(cfgText), "test.toml")
	if err != nil {
		t.Fatalf("bad test config: %s\n%s", err, cfgText)
	}
	if edit != nil {
		edit(cfg)
		if errs := config.Validate(cfg); len(errs) > 0 {
			t.Fatal(errs)
		}
	}
	g, err := engine.New(cfg, engine.Options{Logger: testLog(t), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := g.Serve(ln); err != nil {
			t.Errorf("serve: %s", err)
		}
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.Shutdown(ctx)
		<-done
	})
	return &gateway{g: g, cfg: cfg, url: "http://" + ln.Addr().String()}
}

// join connects gw to its config's [cluster]; it is closed at cleanup (before the gateway shuts down).
func (gw *gateway) join(t testing.TB) *cluster.Cluster {
	t.Helper()
	c, err := cluster.Start(gw.cfg.Cluster, gw.cfg.Egress, gw.g, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	gw.c = c
	return c
}

// fleetConfig renders a gateway config: providers p0..pN-1 over ups, route "m" with strategy over the
// providers named by targets (all when nil), and [cluster] on natsURL unless it is empty, with subject
// "rolter.<t's name>" so that the fleets of one test's cases do not meet.
func fleetConfig(t testing.TB, natsURL, strategy, params string, ups []*upstream, targets []int) string {
	var b strings.Builder
	b.WriteString("[server]\nlisten = \"127.0.0.1:0\"\n")
	if natsURL != "" {
		subject := "rolter." + strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
				return r
			}
			return '_'
		}, t.Name())
		fmt.Fprintf(&b, "[cluster]\nnats_url = %q\nsubject = %q\npublish_interval_ms = 20\nmax_entries = 65536\n",
			natsURL, subject)
	}
	for i, u := range ups {
		fmt.Fprintf(&b, "[[providers]]\nname = \"p%d\"\napi_base = %q\n", i, u.URL())
	}
	fmt.Fprintf(&b, "[[routes]]\nmodel = \"m\"\nstrategy = %q\n", strategy)
	if params != "" {
		b.WriteString("[routes.params]\n" + params + "\n")
	}
	if targets == nil {
		for i := range ups {
			targets = append(targets, i)
		}
	}
	for _, i := range targets {
		fmt.Fprintf(&b, "[[routes.targets]]\nprovider = \"p%d\"\nmodel = \"up-model\"\n", i)
	}
	return b.String()
}

func upstreams(t testing.TB, n int) []*upstream {
	ups := make([]*upstream, n)
	for i := range ups {
		ups[i] = newUpstream(t)
	}
	return ups
}

// chat renders a chat completion request for model "m": a system message, then turns alternating user and
// assistant.
func chat(system string, turns ...string) string {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", system}}
	for i, s := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, msg{role, s})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	return string(b)
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}

// post sends body to the gateway's chat endpoint and returns the status and the response headers.
func post(t testing.TB, gw *gateway, body string) (int, http.Header) {
	t.Helper()
	code, hdr, err := tryPost(gw, body)
	if err != nil {
		t.Fatalf("POST: %s", err)
	}
	return code, hdr
}

func tryPost(gw *gateway, body string) (int, http.Header, error) {
	resp, err := client.Post(gw.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, resp.Header, nil
}

// system is a long system prompt (about 4 KiB) that starts with name, so each conversation has its own.
func system(name string) string {
	return name + ": " + strings.Repeat("You are a careful assistant; answer in full sentences. ", 75)
}

// turns is one conversation's second turn on b after its first on a: where a sent the first, and how b
// decided the second and where it sent it. When b has a cluster, it waits for b to receive a's evidence
// before the second turn.
func turns(t testing.TB, a, b *gateway, name string) (targetA, decisionB, targetB string) {
	t.Helper()
	sys := system(name)
	var before uint64
	if b.c != nil {
		before = b.c.Stats().EvidenceReceived
	}
	code, h := post(t, a, chat(sys, "What is a prefix cache?"))
	if code != 200 {
		t.Fatalf("first turn: status %d", code)
	}
	targetA = h.Get("X-Rolter-Target")
	if b.c != nil {
		waitFor(t, "b to receive a's evidence", func() bool { return b.c.Stats().EvidenceReceived > before })
	}
	code, h = post(t, b, chat(sys, "What is a prefix cache?", "ok", "And why does routing matter?"))
	if code != 200 {
		t.Fatalf("second turn: status %d", code)
	}
	return targetA, h.Get("X-Rolter-Decision"), h.Get("X-Rolter-Target")
}

// waitPeers waits until every cluster is connected and hears from all the others.
func waitPeers(t testing.TB, cs ...*cluster.Cluster) {
	t.Helper()
	waitFor(t, "the replicas to connect and hear from each other", func() bool {
		for _, c := range cs {
			if s := c.Stats(); !s.Connected || s.Peers != len(cs)-1 {
				return false
			}
		}
		return true
	})
}

func TestEvidenceAcrossGateways(t *testing.T) {
	ns := natstest.New(t)
	ups := upstreams(t, 4)
	// A conversation's first turn goes to gateway a, its second to b. With a cluster, b routes the second
	// turn where a sent the first (prefix_hit, from a's evidence alone: b never saw the conversation).
	// Without one, b has no evidence: with home (the default) it picks the conversation's rendezvous home,
	// which is where a sent it too; without home it goes by load and warmth, and not as a prefix hit.
	f := func(clustered, home bool, wantDecision string, wantSameTarget bool) {
		t.Helper()
		t.Run(fmt.Sprintf("clustered=%v,home=%v", clustered, home), func(t *testing.T) {
			evidenceAcross(t, ns, ups, clustered, home, wantDecision, wantSameTarget)
		})
	}
	f(true, false, "prefix_hit", true)
	f(true, true, "prefix_hit", true)
	f(false, true, "home", true)
	f(false, false, "least_warmed", false)
}

func evidenceAcross(t *testing.T, ns *natstest.Server, ups []*upstream, clustered, home bool, wantDecision string,
	wantSameTarget bool) {
	url := ""
	if clustered {
		url = ns.URL()
	}
	params := fmt.Sprintf("home = %v", home)
	a := startGateway(t, fleetConfig(t, url, "cache_aware", params, ups, nil))
	b := startGateway(t, fleetConfig(t, url, "cache_aware", params, ups, nil))
	if clustered {
		waitPeers(t, a.join(t), b.join(t))
	}
	targets := map[string]bool{}
	for i := 0; i < 8; i++ {
		name := fmt.Sprintf("clustered=%v home=%v conversation %d", clustered, home, i)
		targetA, decision, targetB := turns(t, a, b, name)
		targets[targetA] = true
		if decision != wantDecision {
			t.Fatalf("%s: b decided %q; want %q", name, decision, wantDecision)
		}
		if wantSameTarget && targetB != targetA {
			t.Fatalf("%s: b sent the second turn to %s, a the first to %s", name, targetB, targetA)
		}
	}
	// The first turns spread over the targets, so agreeing with a means following it.
	if len(targets) < 2 {
		t.Fatalf("every first turn went to %v: the test proves nothing", targets)
	}
	if clustered {
		// b's decisions were a's evidence, and a has b's second turns.
		if s := a.c.Stats(); s.EvidenceSent == 0 || s.EvidenceReceived == 0 || s.Malformed != 0 {
			t.Fatalf("a: %+v", s)
		}
	}
}

func TestNATSOutage(t *testing.T) {
	ns := natstest.New(t)
	ups := upstreams(t, 4)
	cfg := fleetConfig(t, ns.URL(), "cache_aware", "home = false", ups, nil)
	a, b := startGateway(t, cfg), startGateway(t, cfg)
	ca, cb := a.join(t), b.join(t)
	waitPeers(t, ca, cb)

	// A steady stream of requests to both gateways from a few clients, through the outage.
	var answered, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				gw := a
				if (w+i)%2 == 1 {
					gw = b
				}
				code, _, err := tryPost(gw, chat(system(fmt.Sprintf("client %d request %d", w, i)), "hi"))
				if err != nil || code != 200 {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("status %d, err %v", code, err))
					continue
				}
				answered.Add(1)
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	progress := func(n int64) {
		t.Helper()
		target := answered.Load() + n
		waitFor(t, fmt.Sprintf("%d more answers", n), func() bool { return answered.Load() >= target })
	}
	progress(20)

	ns.Kill()
	waitFor(t, "both replicas to see NATS gone", func() bool {
		return !ca.Stats().Connected && !cb.Stats().Connected
	})
	if m := metricsText(ca); !strings.Contains(m, "\nrolter_cluster_connected 0\n") {
		t.Fatalf("metrics while NATS is down:\n%s", m)
	}
	// Requests keep being answered, on local evidence; what they would have shared is dropped and counted.
	progress(20)
	waitFor(t, "evidence dropped while NATS is down", func() bool {
		return ca.Stats().PublishFailed > 0 && cb.Stats().PublishFailed > 0
	})

	if err := ns.Start(); err != nil {
		t.Fatal(err)
	}
	waitPeers(t, ca, cb)
	if m := metricsText(ca); !strings.Contains(m, "\nrolter_cluster_connected 1\n") {
		t.Fatalf("metrics after NATS came back:\n%s", m)
	}
	progress(20)
	close(stop)
	wg.Wait()
	stop = make(chan struct{}) // for the deferred close
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of %d requests failed during the outage; first: %v", n, n+answered.Load(), firstErr.Load())
	}

	// Evidence flows again. The stream's last evidence arrives within an interval: wait until nothing more
	// comes, so the next evidence b receives is the conversation's.
	quiet(t, ca, cb)
	for i := 0; i < 3; i++ {
		targetA, decision, targetB := turns(t, a, b, fmt.Sprintf("after the outage %d", i))
		if decision != "prefix_hit" || targetA != targetB {
			t.Fatalf("after reconnecting: b decided %q to %s; want prefix_hit to %s", decision, targetB, targetA)
		}
	}
}

// quiet waits until the clusters have received nothing for 10 publish intervals.
func quiet(t testing.TB, cs ...*cluster.Cluster) {
	t.Helper()
	sum := func() (n uint64) {
		for _, c := range cs {
			n += c.Stats().EvidenceReceived
		}
		return n
	}
	last, since := sum(), time.Now()
	waitFor(t, "evidence to stop flowing", func() bool {
		if n := sum(); n != last {
			last, since = n, time.Now()
		}
		return time.Since(since) > 200*time.Millisecond
	})
}

func metricsText(c *cluster.Cluster) string {
	var b bytes.Buffer
	c.WriteMetrics(&b)
	return "\n" + b.String()
}

func TestPeerInflight(t *testing.T) {
	ns := natstest.New(t)
	ups := upstreams(t, 2) // p0 slow, p1 fast
	// Gateway a sends everything to p0; b balances p0 and p1 by load.
	a := startGateway(t, fleetConfig(t, ns.URL(), "least_load", "", ups, []int{0}))
	b := startGateway(t, fleetConfig(t, ns.URL(), "least_load", "", ups, nil))
	waitPeers(t, a.join(t), b.join(t))
	providerLoad := func(gw *gateway, name string) int64 {
		for _, p := range gw.g.Snapshot().Providers {
			if p.Name == name {
				return p.Load()
			}
		}
		t.Fatalf("no provider %s", name)
		return 0
	}
	if l := providerLoad(b, "p0"); l != 0 {
		t.Fatalf("b sees p0 loaded with %d before anything was sent", l)
	}

	const held = 6
	ups[0].holdRequests()
	var wg sync.WaitGroup
	codes := make(chan int, held)
	for i := 0; i < held; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _, _ := tryPost(a, chat(system(fmt.Sprint("held ", i)), "hi"))
			codes <- code
		}()
	}
	waitFor(t, "a's requests to wait on p0", func() bool { return ups[0].waiting.Load() == held })
	waitFor(t, "b to see a's requests on p0", func() bool { return providerLoad(b, "p0") == held })
	// b's own requests now go to p1: p0 is busy with a's.
	for i := 0; i < 10; i++ {
		code, h := post(t, b, chat(system(fmt.Sprint("b ", i)), "hi"))
		if code != 200 || h.Get("X-Rolter-Target") != "p1" {
			t.Fatalf("request %d to b: status %d, target %s; want p1, away from a's load", i, code, h.Get("X-Rolter-Target"))
		}
	}

	ups[0].release()
	wg.Wait()
	close(codes)
	for code := range codes {
		if code != 200 {
			t.Fatalf("a held request ended with %d", code)
		}
	}
	waitFor(t, "b to see p0 free again", func() bool { return providerLoad(b, "p0") == 0 })
}

// stubGateway is a Gateway without a server: the tests of the cluster alone.
type stubGateway struct {
	mu       sync.Mutex
	peers    engine.Peers
	loads    map[string]int64
	setPeers int
}

func (g *stubGateway) SetPeers(p engine.Peers) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.peers = p
	g.setPeers++
}

func (g *stubGateway) SetPeerLoads(loads map[string]int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.loads = loads
}

func (g *stubGateway) Inflight(fn func(string, int64)) { fn("p0", 1) }
func (g *stubGateway) SetLimitShare(int)               {}

func startCluster(t testing.TB, url string, g cluster.Gateway, maxEntries int) *cluster.Cluster {
	t.Helper()
	cfg := config.ClusterConfig{NATSURL: url, Subject: "t", PublishIntervalMs: 20, MaxEntries: maxEntries,
		EvidenceTTLSecs: 600, QueueSize: 4096}
	c, err := cluster.Start(cfg, egress.DefaultConfig(), g, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestStartWithoutNATS(t *testing.T) {
	ns := natstest.New(t)
	ns.Kill()
	a, b := &stubGateway{}, &stubGateway{}
	ca := startCluster(t, ns.URL(), a, 1024)
	if s := ca.Stats(); s.Connected {
		t.Fatal("connected to a stopped server")
	}
	if a.peers != ca {
		t.Fatal("the cluster is not installed as the gateway's Peers while NATS is down")
	}
	cps := []uint64{1, 2, 3}
	ca.Routed(7, cps) // neither blocks nor fails
	if got := ca.Held(7, cps); got != 0 {
		t.Fatalf("Held = %d with no peers", got)
	}
	if m := metricsText(ca); !strings.Contains(m, "\nrolter_cluster_connected 0\n") {
		t.Fatalf("metrics:\n%s", m)
	}
	// It connects by itself once NATS is there.
	if err := ns.Start(); err != nil {
		t.Fatal(err)
	}
	cb := startCluster(t, ns.URL(), b, 1024)
	waitPeers(t, ca, cb)
	cb.Routed(7, cps)
	waitFor(t, "a to hold b's evidence", func() bool { return ca.Held(7, cps) == 3 })
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.loads["p0"] != 1 {
		t.Fatalf("a's peer loads %v; want p0=1 from b", a.loads)
	}
}

func TestStartRefused(t *testing.T) {
	f := func(cfg config.ClusterConfig, eg egress.Config, want string) {
		t.Helper()
		c, err := cluster.Start(cfg, eg, &stubGateway{}, testLog(t))
		if err == nil {
			c.Close()
			t.Fatalf("started with %+v", cfg)
		}
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q; want %q", err, want)
		}
	}
	f(config.ClusterConfig{}, egress.DefaultConfig(), "no nats_url")
	f(config.ClusterConfig{NATSURL: "nats://127.0.0.1:4222"}, egress.Config{DenyCIDRs: []string{"nonsense"}}, "nonsense")
	f(config.ClusterConfig{NATSURL: "nats://127.0.0.1:4222", Subject: "bad subject"}, egress.DefaultConfig(), "cannot subscribe")
}

func TestEgressPolicy(t *testing.T) {
	// NATS on loopback with loopback refused: never connected, and the refusal is logged as the reason.
	ns := natstest.New(t)
	var logs lockedBuffer
	cfg := config.ClusterConfig{NATSURL: ns.URL(), PublishIntervalMs: 20}
	c, err := cluster.Start(cfg, egress.Config{BlockLoopback: true}, &stubGateway{}, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, "the refusal in the log", func() bool {
		return strings.Contains(logs.String(), "egress policy refuses 127.0.0.1: block_loopback")
	})
	if c.Stats().Connected {
		t.Fatal("connected to a loopback address the egress policy refuses")
	}
	if n := strings.Count(logs.String(), "cannot reach NATS"); n != 1 {
		t.Fatalf("the failure to connect logged %d times; want once:\n%s", n, logs.String())
	}

	// With a real gateway the refusals are also counted in its /metrics, as its own connections' are.
	gw := startGateway(t, fleetConfig(t, ns.URL(), "round_robin", "", upstreams(t, 1), nil))
	c2, err := cluster.Start(gw.cfg.Cluster, egress.Config{BlockLoopback: true}, gw.g, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	waitFor(t, `rolter_egress_refused_total{use="cluster"} in the gateway's /metrics`, func() bool {
		resp, err := http.Get(gw.url + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(body), `rolter_egress_refused_total{use="cluster"} `)
	})
}

// lockedBuffer is a bytes.Buffer for a logger written from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func TestMalformedMessages(t *testing.T) {
	ns := natstest.New(t)
	g := &stubGateway{}
	c := startCluster(t, ns.URL(), g, 1024)
	raw, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	waitFor(t, "connected", func() bool { return c.Stats().Connected })
	for _, m := range []struct{ subject, data string }{
		{"t.evidence", ""},
		{"t.evidence", "\x01short"},
		{"t.evidence", "\x03" + strings.Repeat("x", 100)}, // another version (2 is the authenticated envelope)
		{"t.evidence", "\x01" + strings.Repeat("\xff", 100)},
		{"t.load", "{"},
		{"t.load", `{"id":"x","inflight":{"p0":-5}}`},
		{"t.load", strings.Repeat("[", 100000)},
	} {
		if err := raw.Publish(m.subject, []byte(m.data)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "7 malformed messages", func() bool { return c.Stats().Malformed == 7 })
	if s := c.Stats(); s.Entries != 0 || s.Peers != 0 {
		t.Fatalf("malformed messages changed the state: %+v", s)
	}
	if m := metricsText(c); !strings.Contains(m, "\nrolter_cluster_dropped_total{reason=\"malformed\"} 7\n") {
		t.Fatalf("metrics:\n%s", m)
	}
}

func TestCloseLeaksNothing(t *testing.T) {
	ns := natstest.New(t)
	down := natstest.New(t)
	down.Kill() // a port nothing listens on: a cluster that keeps reconnecting
	base := runtime.NumGoroutine()
	for i := 0; i < 3; i++ {
		g1, g2, g3 := &stubGateway{}, &stubGateway{}, &stubGateway{}
		c1 := startCluster(t, ns.URL(), g1, 1024)
		c2 := startCluster(t, ns.URL(), g2, 1024)
		c3 := startCluster(t, down.URL(), g3, 1024)
		waitPeers(t, c1, c2)
		cps := []uint64{uint64(i), 2, 3}
		c1.Routed(7, cps)
		waitFor(t, "evidence", func() bool { return c2.Held(7, cps) == 3 })
		for _, c := range []*cluster.Cluster{c1, c2, c3, c1} { // twice: Close is idempotent
			c.Close()
		}
		for _, g := range []*stubGateway{g1, g2, g3} {
			g.mu.Lock()
			if g.peers != nil || g.loads != nil || g.setPeers != 2 {
				t.Fatalf("after Close: peers %v, loads %v, SetPeers called %d times", g.peers, g.loads, g.setPeers)
			}
			g.mu.Unlock()
		}
	}
	// nats.go's goroutines end shortly after Close returns.
	waitFor(t, "the clusters' goroutines to end", func() bool { return runtime.NumGoroutine() <= base+2 })
}
