//go:build !race

package engine

import (
	"bytes"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/kvindex"
)

// TestAllocsRoutingPath pins the allocation contract of the request path up to the pick: body parse,
// prompt key, route lookup, eligibility and strategy ranking allocate nothing for a 20-message chat body.
func TestAllocsRoutingPath(t *testing.T) {
	for _, strategy := range []string{"round_robin", "random", "weighted", "least_load", "power_of_two"} {
		g, ctx := benchCall(t, strategy)
		c := g.acquireCall(g.acquireSnapshot())
		allocs := testing.AllocsPerRun(200, func() {
			c.route = nil
			if e := readAndPrepare(c, ctx); e != nil {
				t.Fatal(e.message)
			}
		})
		if allocs != 0 {
			t.Fatalf("%s: %v allocs per request, want 0", strategy, allocs)
		}
	}
}

func TestAllocsRequestID(t *testing.T) {
	buf := make([]byte, 0, 64)
	id := []byte("req-1")
	if a := testing.AllocsPerRun(100, func() { buf = requestID(nil, buf[:0]); buf = requestID(id, buf[:0]) }); a != 0 {
		t.Fatalf("%v allocs", a)
	}
}

// TestAllocsCacheAwarePick: a cache_aware decision (trie matches on every target) allocates nothing.
func TestAllocsCacheAwarePick(t *testing.T) {
	r, s := cacheRoute(t, 8, "")
	key := []byte(systemPrompt + "\x1euser\x1fquestion")
	for i, tr := range s.tries {
		tr.Insert(key[:len(key)-i])
	}
	var buf, out [maxTargets]int
	var p Pick
	allEligible(r, &p, buf[:])
	p.Key = key
	if a := testing.AllocsPerRun(200, func() { r.Strategy.Rank(&p, out[:]) }); a != 0 {
		t.Fatalf("%v allocs per pick", a)
	}
	g, ctx := benchCall(t, "cache_aware")
	c := g.acquireCall(g.acquireSnapshot())
	if a := testing.AllocsPerRun(200, func() {
		c.route = nil
		if e := readAndPrepare(c, ctx); e != nil {
			t.Fatal(e.message)
		}
	}); a != 0 {
		t.Fatalf("%v allocs per request up to the pick", a)
	}
	// With the peers' evidence as a second score: the checkpoints and the lookups allocate nothing either.
	g.SetPeers(heldPeers(3))
	if a := testing.AllocsPerRun(200, func() {
		c.route = nil
		if e := readAndPrepare(c, ctx); e != nil {
			t.Fatal(e.message)
		}
	}); a != 0 || !c.pick.cpsDone || len(c.pick.cps) == 0 {
		t.Fatalf("%v allocs per request up to the pick with peers (checkpoints %d)", a, len(c.pick.cps))
	}
}

func TestAllocsPipelineAndHash(t *testing.T) {
	for _, strategy := range []string{"pipeline", "consistent_hash"} {
		r := testRoute(t, strategy, []float64{1, 2, 1, 1}, "")
		var buf, out [maxTargets]int
		var p Pick
		allEligible(r, &p, buf[:])
		p.Key = []byte(systemPrompt)
		p.SessionID = []byte("session-42")
		if rec, ok := r.Strategy.(Recorder); ok {
			rec.Routed(&p, 1) // binds the session: later picks are lookups
		}
		if a := testing.AllocsPerRun(200, func() { r.rank(&p, out[:]) }); a != 0 {
			t.Fatalf("%s: %v allocs per pick", strategy, a)
		}
		p.SessionID = nil
		if a := testing.AllocsPerRun(200, func() { r.rank(&p, out[:]) }); a != 0 {
			t.Fatalf("%s without session: %v allocs per pick", strategy, a)
		}
		// Every target but the idle one over the load bound: the bound moves the request there.
		for i, tg := range r.Targets {
			tg.Provider.inflight.Store([]int64{0, 2000, 1000, 1000}[i])
		}
		if a := testing.AllocsPerRun(200, func() { r.rank(&p, out[:]) }); a != 0 {
			t.Fatalf("%s at the load bound: %v allocs per pick", strategy, a)
		}
		if _, d := r.rank(&p, out[:]); out[0] != 0 {
			t.Fatalf("%s at the load bound picked %d (%s), want the idle target 0", strategy, out[0], d.Reason)
		}
	}
}

func TestAllocsPrecisePick(t *testing.T) {
	tokens := make([]uint32, 4096)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	r := preciseRoute(t, 4, tokens)
	var buf, out [maxTargets]int
	var kvOut [kvindex.MaxTargets]int
	var scratch kvindex.Scratch
	var p Pick
	allEligible(r, &p, buf[:])
	p.TokenIDs, p.TokenIDsState, p.kvScratch, p.kvOut = tokens, tokenIDsOK, &scratch, kvOut[:]
	if a := testing.AllocsPerRun(100, func() { r.rank(&p, out[:]) }); a != 0 {
		t.Fatalf("%v allocs per pick", a)
	}
	if _, d := r.rank(&p, out[:]); out[0] != 3 || d.Reason != ReasonPrefixHit {
		t.Fatalf("picked %d (%s), want 3", out[0], d.Reason)
	}
	var c call
	if a := testing.AllocsPerRun(100, func() { c.tokens, _ = parseTokenIDs(c.tokens[:0], []byte("1,22,333,4444,55555")) }); a != 0 {
		t.Fatalf("%v allocs per header parse", a)
	}
}

// TestHugeRequestBuffersNotPooled: a call that handled a huge body goes back to the pool without its large
// buffers, so the pool never pins them.
func TestHugeRequestBuffersNotPooled(t *testing.T) {
	g, ctx := benchCall(t, "round_robin")
	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 2<<20) + `"}]}`
	ctx.Request.SetBodyString(big)
	for i := 0; i < 20; i++ {
		c := g.acquireCall(g.acquireSnapshot())
		c.admitGlobal()
		if e := readAndPrepare(c, ctx); e != nil {
			t.Fatal(e.message)
		}
		if cap(c.reqBody) < 2<<20 || cap(c.key) < 2<<20 {
			t.Fatalf("body %d and key %d bytes: the test does not exercise a huge request", cap(c.reqBody), cap(c.key))
		}
		c.release()
		if cap(c.reqBody) > maxPooledBuf || cap(c.key) > maxPooledBuf {
			t.Fatalf("a released call keeps %d body and %d key bytes", cap(c.reqBody), cap(c.key))
		}
		if g.bodyMem.Load() != 0 || g.inflight.Load() != 0 {
			t.Fatalf("body memory %d and %d in flight after release, want 0", g.bodyMem.Load(), g.inflight.Load())
		}
	}
}

// TestAllocsWholeRequest is the allocation contract of one whole proxied request - client, gateway and
// upstream on in-memory listeners, a chat body in, a completion out: at most one allocation per request,
// and that one is fasthttp's, not ours (the server drains every streamed request body through io.CopyN,
// whose LimitReader escapes). Any allocation the gateway adds breaks it.
func TestAllocsWholeRequest(t *testing.T) {
	hc := benchProxy(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(benchReply)
	})
	assertWholeRequestAllocs(t, hc)
}

// assertWholeRequestAllocs sends chat requests through hc and fails if one allocates more than once.
func assertWholeRequestAllocs(t *testing.T, hc *fasthttp.HostClient) {
	t.Helper()
	body := []byte(chatBody("m", strings.Repeat("hello ", 100), false))
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod("POST")
	req.SetRequestURI("http://gateway/v1/chat/completions")
	req.Header.SetContentType("application/json")
	req.SetBody(body)
	do := func() {
		if err := hc.Do(req, resp); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode() != 200 || len(resp.Body()) != len(benchReply) {
			t.Fatalf("status %d body %q", resp.StatusCode(), resp.Body())
		}
	}
	for i := 0; i < 100; i++ {
		do() // pools, buffers and connections warm up
	}
	if a := testing.AllocsPerRun(2000, do); a > 1 {
		t.Fatalf("%v allocs per whole proxied request, want at most 1 (fasthttp's body drain)", a)
	}
}

// TestAllocsWholeRequestTCP is TestAllocsWholeRequest over loopback sockets, where the gateway peeks at
// every pooled upstream connection before reusing it (uconn.quiet): the in-memory listeners have no socket
// to peek at.
func TestAllocsWholeRequestTCP(t *testing.T) {
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	upSrv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(benchReply)
	}}
	go upSrv.Serve(upLn) //nolint:errcheck
	t.Cleanup(func() { _ = upSrv.Shutdown() })
	cfg, err := config.Parse([]byte(gatewayConfig("least_load", "", "http://"+upLn.Addr().String())), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(cfg, Options{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	gwLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(gwLn) //nolint:errcheck
	t.Cleanup(func() { _ = g.Shutdown(contextDone()) })
	assertWholeRequestAllocs(t, &fasthttp.HostClient{Addr: gwLn.Addr().String()})
}

// TestAllocsKeyedRoute: the data-plane key check (a keyed hash of the secret, looked up in the snapshot)
// adds no allocation to the routing path.
func TestAllocsKeyedRoute(t *testing.T) {
	cfg := keyedConfig(t, "http://127.0.0.1:9")
	g, err := New(cfg, Options{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Shutdown(contextDone())
	ctx := &fasthttp.RequestCtx{}
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.Header.SetContentType("application/json")
	ctx.Request.Header.Set("Authorization", "Bearer sk-one")
	ctx.Request.SetRequestURI("/v1/chat/completions")
	ctx.Request.SetBodyString(strings.Replace(chat20, `"model":"m"`, `"model":"m1"`, 1))
	c := g.acquireCall(g.acquireSnapshot())
	if e := readAndPrepare(c, ctx); e != nil || !c.stripAuth {
		t.Fatalf("keyed request refused: %v", e)
	}
	if a := testing.AllocsPerRun(200, func() {
		c.route = nil
		if e := readAndPrepare(c, ctx); e != nil {
			t.Fatal(e.message)
		}
	}); a != 0 {
		t.Fatalf("%v allocs per keyed request up to the pick", a)
	}
}

// TestAllocsPublicRouteWithKey: recognising a data-plane key sent to a public route (so that it is not
// forwarded) adds no allocation either.
func TestAllocsPublicRouteWithKey(t *testing.T) {
	cfg := keyedConfig(t, "http://127.0.0.1:9")
	g, err := New(cfg, Options{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Shutdown(contextDone())
	ctx := &fasthttp.RequestCtx{}
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.Header.SetContentType("application/json")
	ctx.Request.Header.Set("Authorization", "Bearer sk-one")
	ctx.Request.SetRequestURI("/v1/chat/completions")
	ctx.Request.SetBodyString(strings.Replace(chat20, `"model":"m"`, `"model":"pub"`, 1))
	c := g.acquireCall(g.acquireSnapshot())
	if e := readAndPrepare(c, ctx); e != nil || !c.stripAuth {
		t.Fatalf("public request with a key: %v, strip %v", e, c.stripAuth)
	}
	if a := testing.AllocsPerRun(200, func() {
		c.route = nil
		if e := readAndPrepare(c, ctx); e != nil {
			t.Fatal(e.message)
		}
	}); a != 0 {
		t.Fatalf("%v allocs per public request with a key up to the pick", a)
	}
}

// TestAllocsDisaggregatedRequest: a request of a disaggregated route - the prefill hop, its answer's
// params parsed and copied, the decode hop - allocates no more than an ordinary proxied one.
func TestAllocsDisaggregatedRequest(t *testing.T) {
	prefillAnswer := `{"id":"p","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"length"}],` +
		`"usage":{"prompt_tokens":300,"completion_tokens":1,"total_tokens":301,"prompt_tokens_details":{"cached_tokens":128}},` +
		`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2,3],"remote_engine_id":"e","remote_host":"10.0.0.1","remote_port":5600,"tp_size":1}}`
	var prefills, decodes atomic.Int64
	upLn := fasthttputil.NewInmemoryListener()
	upSrv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		if bytes.Contains(ctx.PostBody(), []byte(`"do_remote_decode":true`)) {
			prefills.Add(1)
			ctx.SetBodyString(prefillAnswer)
			return
		}
		decodes.Add(1)
		ctx.SetBodyString(benchReply)
	}}
	go upSrv.Serve(upLn) //nolint:errcheck
	t.Cleanup(func() { _ = upSrv.Shutdown() })
	cfg, err := config.Parse([]byte(pdFakes([]string{"http://prefill:80"}, []string{"http://decode:80"}, "cache_aware",
		"prefill_threshold_tokens = 0", "")), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(cfg, Options{Logger: quietLog(), Dial: func(string, time.Duration) (net.Conn, error) { return upLn.Dial() }})
	if err != nil {
		t.Fatal(err)
	}
	gwLn := fasthttputil.NewInmemoryListener()
	go g.Serve(gwLn) //nolint:errcheck
	t.Cleanup(func() { _ = g.Shutdown(contextDone()) })
	assertWholeRequestAllocs(t, &fasthttp.HostClient{Addr: "gateway", Dial: func(string) (net.Conn, error) { return gwLn.Dial() }})
	if p, d := prefills.Load(), decodes.Load(); p == 0 || p != d {
		t.Fatalf("%d prefill and %d decode requests; want as many of each", p, d)
	}
}

// TestAllocsLimitedKey: a keyed request under its key's, model's and org's limits - the reservation, the
// rate-limit headers and the settlement - allocates nothing more than one without.
func TestAllocsLimitedKey(t *testing.T) {
	g, ctx := limitedCall(t, true)
	c := g.acquireCall(g.acquireSnapshot())
	if e := readAndPrepare(c, ctx); e != nil || !c.limited {
		t.Fatalf("limited request: %v, limited %v", e, c.limited)
	}
	c.settleLimits(200)
	if a := testing.AllocsPerRun(200, func() {
		c.route = nil
		if e := readAndPrepare(c, ctx); e != nil {
			t.Fatal(e.message)
		}
		c.limitHeaders(&ctx.Response.Header)
		c.settleLimits(200)
	}); a != 0 {
		t.Fatalf("%v allocs per limited request", a)
	}
	if ctx.Response.Header.Peek("X-Ratelimit-Remaining-Tokens") == nil {
		t.Fatal("no rate-limit headers")
	}
}
