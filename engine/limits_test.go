package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/config"
)

// limitedGateway starts a gateway over upstream url whose org1 key "sk-one" has key limits k (nil: none)
// and whose org1 has org limits o (nil: none).
func limitedGateway(t *testing.T, url string, k, o *config.Limits) *testGateway {
	t.Helper()
	cfg := keyedConfig(t, url)
	cfg.Keys[0].ID, cfg.Keys[0].Limits = "key_one", k
	if o != nil {
		cfg.OrgLimits = map[string]config.OrgLimits{"org1": {Org: o}}
	}
	return startGatewayConfig(t, cfg, Options{})
}

// TestRateLimitRequests: a key limited to 10 requests a minute gets 10 answers, each with OpenAI's
// x-ratelimit-*-requests headers counting down, and an 11th answered 429 rate_limit_exceeded with
// Retry-After, which the OpenAI Node SDK waits before it retries and gets its answer. Another org's key is
// not affected.
func TestRateLimitRequests(t *testing.T) {
	var upstream atomic.Int64
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		upstream.Add(1)
		okJSON(w, r)
	})
	gw := limitedGateway(t, up.URL, &config.Limits{RPM: 10}, nil)
	for i := range 10 {
		resp, body := post(t, gw.URL+"/v1/chat/completions", chatBody("m1", "x", false), "Authorization", "Bearer sk-one")
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i+1, resp.StatusCode, body)
		}
		h := resp.Header
		if h.Get("X-Ratelimit-Limit-Requests") != "10" || h.Get("X-Ratelimit-Remaining-Requests") != strconv.Itoa(9-i) ||
			h.Get("X-Ratelimit-Reset-Requests") == "" || h.Get("X-Ratelimit-Limit-Tokens") != "" {
			t.Fatalf("request %d: rate-limit headers %v", i+1, h)
		}
	}
	resp, body := post(t, gw.URL+"/v1/chat/completions", chatBody("m1", "x", false), "Authorization", "Bearer sk-one")
	var e struct {
		Error struct{ Message, Type, Code string }
	}
	_ = json.Unmarshal([]byte(body), &e)
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != 429 || e.Error.Code != "rate_limit_exceeded" || e.Error.Type != "rate_limit_error" ||
		!strings.Contains(e.Error.Message, `key "key_one"`) || ra < 5 || ra > 6 || resp.Header.Get("Retry-After-Ms") == "" ||
		resp.Header.Get("X-Ratelimit-Remaining-Requests") != "0" {
		t.Fatalf("11th request: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if n := upstream.Load(); n != 10 {
		t.Fatalf("the upstream got %d requests, want 10: a refused request is not sent", n)
	}
	if resp, body := post(t, gw.URL+"/v1/chat/completions", chatBody("m2", "x", false), "Authorization", "Bearer sk-two"); resp.StatusCode != 200 {
		t.Fatalf("another org's key: %d %s", resp.StatusCode, body)
	}

	// The SDK is told to wait about 6 s (one request's share of the minute) and gets its answer after.
	node, dir := nodeSDK(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "ratelimit.mjs"), gw.URL+"/v1", "sk-one")
	cmd.Dir = dir
	outb, err := cmd.CombinedOutput()
	out := strings.TrimSpace(string(outb))
	if err != nil {
		t.Fatalf("ratelimit.mjs: %s\n%s", err, out)
	}
	var res struct {
		OK        bool
		Ms        int64
		Remaining string
		Error     string
	}
	if err := json.Unmarshal([]byte(out[strings.LastIndex(out, "\n")+1:]), &res); err != nil {
		t.Fatalf("cannot parse: %s\n%s", err, out)
	}
	// A lower bound only: the SDK waited what it was told (less the time the test took to get here).
	if !res.OK || res.Ms < 3000 || res.Remaining != "0" {
		t.Fatalf("the SDK's retried request: %s", out)
	}
	if n := upstream.Load(); n != 12 {
		t.Fatalf("the upstream got %d requests, want 12", n)
	}
}

// TestRateLimitTokensUnderConcurrentStreams: 64 concurrent streaming requests against a tokens-per-minute
// limit all reach admission before any answer ends (the upstream holds them), as a burst does; the
// reservations made at admission let no more through than the limit allows plus at most one reservation,
// and the others are answered 429 with the tokens headers.
func TestRateLimitTokensUnderConcurrentStreams(t *testing.T) {
	const limit, maxTokens = 2000, 100
	release := make(chan struct{})
	var upstream atomic.Int64
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		upstream.Add(1)
		<-release
		w.Header().Set("Content-Type", "text/event-stream")
		for range 5 {
			fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n")
		}
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":5,\"total_tokens\":25}}\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	gw := limitedGateway(t, up.URL, &config.Limits{TPM: limit}, nil)
	// The 64 keep-alive connections would hold the gateway's shutdown up.
	defer testClient.CloseIdleConnections()
	body := fmt.Sprintf(`{"model":"m1","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`,
		maxTokens, strings.Repeat("word ", 40))
	var wg sync.WaitGroup
	var ok, refused atomic.Int64
	var reserved atomic.Int64 // what one admitted request reserved, from its Remaining header
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", gw.URL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer sk-one")
			resp, err := testClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			switch resp.StatusCode {
			case 200:
				ok.Add(1)
			case 429:
				if resp.Header.Get("X-Ratelimit-Limit-Tokens") != strconv.Itoa(limit) || resp.Header.Get("Retry-After") == "" {
					t.Errorf("429 without the tokens headers: %v", resp.Header)
				}
				refused.Add(1)
				if rem, err := strconv.Atoi(resp.Header.Get("X-Ratelimit-Remaining-Tokens")); err == nil && rem >= 0 {
					reserved.CompareAndSwap(0, int64(rem)+1) // marks that a 429 saw the headers
				}
			default:
				t.Errorf("status %d", resp.StatusCode)
			}
		}()
	}
	waitFor(t, 10*time.Second, "every request admitted or refused", func() bool { return upstream.Load()+refused.Load() == 64 })
	admitted := upstream.Load()
	close(release)
	wg.Wait()
	// One request reserves its prompt's estimate plus max_tokens.
	per := estimateTokens(len("user\x1f"+strings.Repeat("word ", 40)+"\x1e")) + maxTokens
	if admitted < 1 || admitted*per > limit+per || ok.Load() != admitted || refused.Load() != 64-admitted {
		t.Fatalf("admitted %d of 64 at %d tokens each against %d a minute (%d answered, %d refused)", admitted, per, limit, ok.Load(), refused.Load())
	}
	// Settled on the usage (25 each, the probes' too), the unused reservations come back.
	probes := int64(0)
	waitFor(t, 10*time.Second, "the unused reservations given back", func() bool {
		probes++
		return remainingTokens(t, gw.URL) >= limit-(admitted+probes-1)*25-probeReserve
	})
}

// probeReserve is what probe reserves: its prompt's estimate and its one token.
var probeReserve = estimateTokens(len("user\x1fp\x1e")) + 1

// remainingTokens sends a request of one token with the key of limitedGateway and returns the tokens its
// answer says remain (its own reservation still held).
func remainingTokens(t *testing.T, url string) int64 {
	t.Helper()
	resp, body := post(t, url+"/v1/chat/completions", `{"model":"m1","max_tokens":1,"messages":[{"role":"user","content":"p"}]}`,
		"Authorization", "Bearer sk-one")
	rem, err := strconv.ParseInt(resp.Header.Get("X-Ratelimit-Remaining-Tokens"), 10, 64)
	if resp.StatusCode != 200 || err != nil {
		t.Fatalf("probe: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	return rem
}

// TestRateLimitChargesWhatAStreamDelivered: a client that leaves a stream without usage part-way is charged
// its prompt's estimate and the events the gateway passed on - at least what the client read, at most what
// the engine sent - and given back the rest of its reservation (max_tokens).
func TestRateLimitChargesWhatAStreamDelivered(t *testing.T) {
	const limit, maxTokens, engineEvents = 10_000, 5000, 500
	var sent atomic.Int64
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(b), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"x"}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for range engineEvents {
			if _, err := fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n"); err != nil {
				return
			}
			fl.Flush()
			sent.Add(1)
			time.Sleep(time.Millisecond)
		}
	})
	gw := limitedGateway(t, up.URL, &config.Limits{TPM: limit}, nil)
	body := fmt.Sprintf(`{"model":"m1","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"hi"}]}`, maxTokens)
	req, _ := http.NewRequest("POST", gw.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer sk-one")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	// Read 20 events, then leave.
	buf := make([]byte, 1)
	events := 0
	var line []byte
	for events < 20 {
		if _, err := resp.Body.Read(buf); err != nil {
			t.Fatal(err)
		}
		line = append(line, buf[0])
		if strings.HasSuffix(string(line), "\n\n") {
			events++
			line = line[:0]
		}
	}
	resp.Body.Close()
	// Until the gateway sees the client gone, the reservation holds.
	var charged int64
	start := time.Now()
	waitFor(t, 10*time.Second, "the stream settled", func() bool {
		charged = limit - probeReserve - remainingTokens(t, gw.URL)
		return charged < maxTokens/2
	})
	// The bucket refills at limit/minute meanwhile, and each probe uses 2: slack for both.
	slack := int64(time.Since(start).Seconds()*limit/60) + 1 + 2*10
	prompt := estimateTokens(len("user\x1fhi\x1e"))
	if charged < prompt+20-slack || charged > prompt+sent.Load()+slack {
		t.Fatalf("charged about %d tokens for a stream the client left after 20 of the %d events the engine sent (prompt %d)", charged, sent.Load(), prompt)
	}
}

// limitedCall is a keyed chat request on a gateway whose key and org have limits (lim) or not.
func limitedCall(tb testing.TB, lim bool) (*Gateway, *fasthttp.RequestCtx) {
	tb.Helper()
	cfg := keyedConfig(tb, "http://127.0.0.1:9")
	if lim {
		cfg.Keys[0].ID = "key_one"
		cfg.Keys[0].Limits = &config.Limits{RPM: 1 << 40, TPM: 1 << 40, Concurrent: 1 << 20,
			Models: map[string]config.ModelLimits{"m1": {TPM: 1 << 40}}}
		cfg.OrgLimits = map[string]config.OrgLimits{"org1": {Org: &config.Limits{RPM: 1 << 40, TPM: 1 << 40}}}
	}
	g, err := New(cfg, Options{Logger: quietLog()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { g.Shutdown(contextDone()) })
	ctx := &fasthttp.RequestCtx{}
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.Header.SetContentType("application/json")
	ctx.Request.Header.Set("Authorization", "Bearer sk-one")
	ctx.Request.SetRequestURI("/v1/chat/completions")
	ctx.Request.SetBodyString(strings.Replace(chat20, `"model":"m"`, `"model":"m1"`, 1))
	return g, ctx
}

// BenchmarkLimitedRoutingPath is the routing path of a keyed request (BenchmarkRoutingPath's: up to the
// pick), without limits and with four scopes of them (the key, its model, the org), the reservation's
// settlement included.
func BenchmarkLimitedRoutingPath(b *testing.B) {
	for _, lim := range []bool{false, true} {
		name := "unlimited"
		if lim {
			name = "limited"
		}
		b.Run(name, func(b *testing.B) {
			g, ctx := limitedCall(b, lim)
			c := g.acquireCall(g.acquireSnapshot())
			b.ReportAllocs()
			for b.Loop() {
				c.route = nil
				if e := readAndPrepare(c, ctx); e != nil {
					b.Fatal(e.message)
				}
				c.settleLimits(200)
			}
		})
	}
}

// BenchmarkLimitHeaders is what a limited request's answer adds: OpenAI's six x-ratelimit-* headers from
// the tightest of its scopes.
func BenchmarkLimitHeaders(b *testing.B) {
	g, ctx := limitedCall(b, true)
	c := g.acquireCall(g.acquireSnapshot())
	if e := readAndPrepare(c, ctx); e != nil {
		b.Fatal(e.message)
	}
	b.ReportAllocs()
	for b.Loop() {
		c.limitHeaders(&ctx.Response.Header)
	}
	c.settleLimits(200)
}

// TestRateLimitErrorNotCharged: an answer the engine refused (a 400 passed on) gives back its whole token
// reservation; it still counts as a request.
func TestRateLimitErrorNotCharged(t *testing.T) {
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if strings.Contains(string(b), "too long") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(400)
			fmt.Fprint(w, `{"error":{"message":"maximum context length exceeded","type":"BadRequestError","code":400}}`)
			return
		}
		okJSON(w, r)
	})
	gw := limitedGateway(t, up.URL, &config.Limits{TPM: 10_000, RPM: 100}, nil)
	resp, body := post(t, gw.URL+"/v1/chat/completions", `{"model":"m1","max_tokens":4000,"messages":[{"role":"user","content":"too long"}]}`,
		"Authorization", "Bearer sk-one")
	if resp.StatusCode != 400 || resp.Header.Get("X-Ratelimit-Limit-Tokens") != "10000" {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
	waitFor(t, 5*time.Second, "the reservation given back", func() bool { return remainingTokens(t, gw.URL) >= 10_000-probeReserve-3 })
	resp, _ = post(t, gw.URL+"/v1/chat/completions", chatBody("m1", "x", false), "Authorization", "Bearer sk-one")
	if rem, _ := strconv.Atoi(resp.Header.Get("X-Ratelimit-Remaining-Requests")); rem > 97 {
		t.Fatalf("remaining requests %d: the refused answer counts as a request", rem)
	}
}

// TestRateLimitAcrossReloads: a reload that leaves a key's limits as they were keeps what the key used; a
// new limit starts full. A request asking more tokens than a whole minute of its limit is refused for
// good (x-should-retry: false), whatever it says.
func TestRateLimitAcrossReloads(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	cfg := keyedConfig(t, up.URL)
	cfg.Keys[0].ID, cfg.Keys[0].Limits = "key_one", &config.Limits{RPM: 3, TPM: 5000}
	gw := startGatewayConfig(t, cfg, Options{})
	send := func(body string, want int) *http.Response {
		t.Helper()
		resp, b := post(t, gw.URL+"/v1/chat/completions", body, "Authorization", "Bearer sk-one")
		if resp.StatusCode != want {
			t.Fatalf("%d, want %d: %s", resp.StatusCode, want, b)
		}
		return resp
	}
	small := `{"model":"m1","max_tokens":10,"messages":[{"role":"user","content":"x"}]}`
	for range 3 {
		send(small, 200)
	}
	next := keyedConfig(t, up.URL)
	next.Keys[0].ID, next.Keys[0].Limits = "key_one", &config.Limits{RPM: 3, TPM: 5000}
	next.Routes = append(next.Routes, config.RouteConfig{Model: "extra", Targets: []config.TargetConfig{{Provider: "p0"}}})
	if errs := config.Validate(next); len(errs) > 0 {
		t.Fatal(errs)
	}
	if err := gw.g.Reload(next); err != nil {
		t.Fatal(err)
	}
	send(small, 429)
	next.Keys[0].Limits = &config.Limits{RPM: 4, TPM: 5000}
	if err := gw.g.Reload(next); err != nil {
		t.Fatal(err)
	}
	send(small, 200)
	for _, body := range []string{
		`{"model":"m1","max_tokens":6000,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m1","max_tokens":9007199254740992,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m1","max_completion_tokens":5001,"messages":[{"role":"user","content":"x"}]}`,
	} {
		if resp := send(body, 429); resp.Header.Get("X-Should-Retry") != "false" || resp.Header.Get("Retry-After") != "" {
			t.Fatalf("an impossible request: %v", resp.Header)
		}
	}
	send(`{"model":"m1","max_tokens":-5,"messages":[{"role":"user","content":"x"}]}`, 200) // not a count: the default reserved
}
