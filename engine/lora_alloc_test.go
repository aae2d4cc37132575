//go:build !race

package engine

import (
	"fmt"
	"math/bits"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/telemetry"
)

// TestAllocsAdapterRoutePick: the request path of an adapter route up to the pick - body, route, the home
// set narrowing the eligible targets (width, holders, rendezvous order, slot pictures), the strategy - and
// the adapter's sent/done accounting allocate nothing.
func TestAllocsAdapterRoutePick(t *testing.T) {
	urls := make([]string, 8)
	perm := make([]int, 8)
	for i := range urls {
		urls[i], perm[i] = fmt.Sprintf("http://127.0.0.1:%d", 20000+i), i
	}
	for _, strategy := range []string{"round_robin", "least_load", "power_of_two", "cache_aware"} {
		cfg, err := config.Parse([]byte(loraConfig(strategy, urls, perm, 4, "home_replicas = 2\nmax_home_replicas = 4\n")), "l.toml")
		if err != nil {
			t.Fatal(err)
		}
		g, err := New(cfg, Options{Logger: quietLog()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Shutdown(contextDone()) })
		ctx := &fasthttp.RequestCtx{}
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.Header.SetContentType("application/json")
		ctx.Request.SetRequestURI("/v1/chat/completions")
		ctx.Request.SetBodyString(strings.Replace(chat20, `"model":"m"`, `"model":"a1"`, 1))
		c := g.acquireCall(g.acquireSnapshot())
		pick := func() {
			c.route = nil
			if e := readAndPrepare(c, ctx); e != nil {
				t.Fatal(e.message)
			}
			lr, ti := c.route.lora, c.order[0]
			lr.sent(c.route.Targets[ti], c.pick.Now)
			lr.done(ti)
		}
		pick()
		if c.route.lora == nil || c.route.Model != "a1" || bits.OnesCount64(c.pick.EligibleMask) != 2 || c.nOrder < 1 {
			t.Fatalf("%s: route %s, eligible %b, %d candidates: not an adapter route's home set of 2", strategy, c.route.Model, c.pick.EligibleMask, c.nOrder)
		}
		if a := testing.AllocsPerRun(200, pick); a != 0 {
			t.Fatalf("%s: %v allocs per adapter request up to the pick", strategy, a)
		}
	}
}

// TestAllocsAdapterRouteResidency: with the engines' adapter residency known ([metrics_scrape]: lists,
// running adapters, slots) and dynamic loading on, the home set, the pick, the check that the chosen
// replica has the adapter and the accounting allocate nothing.
func TestAllocsAdapterRouteResidency(t *testing.T) {
	urls := make([]string, 8)
	perm := make([]int, 8)
	for i := range urls {
		urls[i], perm[i] = fmt.Sprintf("http://127.0.0.1:%d", 20000+i), i
	}
	text := loraConfig("least_load", urls, perm, 4, "home_replicas = 2\nmax_home_replicas = 4\ndynamic_lora = true\nadapter_path = \"/l/{adapter}\"\n") +
		"[metrics_scrape]\nenabled = true\ninterval_secs = 3600\n"
	cfg, err := config.Parse([]byte(text), "l.toml")
	if err != nil {
		t.Fatal(err)
	}
	s := testSnapshot(t, cfg)
	var r *Route
	for _, sr := range s.Routes {
		if sr.Model == "a1" {
			r = sr
		}
	}
	now := time.Now().UnixNano()
	for i, p := range s.Providers {
		if p.adapters == nil {
			t.Fatalf("%s: no residency with [metrics_scrape] on", p.Name)
		}
		// Every engine lists a1; the odd ones run it, with two slots.
		p.adapters.a.StoreModels(telemetry.ModelList{Base: []string{"up-base"}, Adapters: []telemetry.AdapterCard{{Name: "a0", Parent: "up-base"}, {Name: "a1", Parent: "up-base"}}}, now)
		sample := telemetry.LoRASample{Seen: true, MaxLoRA: 2}
		if i%2 == 1 {
			sample.Running = []string{"a1"}
		}
		p.adapters.a.StoreBatch(sample, now)
	}
	var buf, out [maxTargets]int
	var p Pick
	pick := func() {
		allEligible(r, &p, buf[:])
		p.Now = time.Now().UnixNano()
		r.lora.restrict(&p)
		n, _ := r.Strategy.Rank(&p, out[:])
		if n < 1 {
			t.Fatal("no candidate")
		}
		ti := out[0]
		tg := r.Targets[ti]
		if err := r.lora.ensure(tg, ti); err != nil {
			t.Fatal(err)
		}
		r.lora.sent(tg, p.Now)
		r.lora.done(ti)
	}
	pick()
	if r.lora == nil || bits.OnesCount64(p.EligibleMask) != 2 {
		t.Fatalf("eligible %b: not an adapter route's home set of 2", p.EligibleMask)
	}
	for i := range r.Targets {
		if p.EligibleMask&(1<<i) != 0 && !r.lora.holds(r.Targets[i], i, p.Now) {
			t.Fatalf("the home set %b has %s, which does not run a1, while 4 engines do", p.EligibleMask, r.Targets[i].Provider.Name)
		}
	}
	if a := testing.AllocsPerRun(200, pick); a != 0 {
		t.Fatalf("%v allocs per adapter pick with residency known", a)
	}
}

// TestAllocsAdapterWholeRequest: a whole proxied request of an adapter route - home set, admission and its
// accounting, dynamic_lora's check that the replica has the adapter - keeps the contract of
// TestAllocsWholeRequest: at most one allocation, fasthttp's.
func TestAllocsAdapterWholeRequest(t *testing.T) {
	for _, lora := range []string{"", "dynamic_lora = true\nadapter_path = \"/l/{adapter}\"\n"} {
		var loads atomic.Int64
		hc := benchProxyExtra(t, func(ctx *fasthttp.RequestCtx) {
			if string(ctx.Path()) == "/v1/load_lora_adapter" {
				loads.Add(1)
				ctx.SetBodyString("Success: LoRA adapter 'a0' added successfully.")
				return
			}
			ctx.SetContentType("application/json")
			ctx.SetBodyString(benchReply)
		}, "[routes.lora]\nadapters = [\"a0\", \"a1\"]\n"+lora)
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.Header.SetMethod("POST")
		req.SetRequestURI("http://gateway/v1/chat/completions")
		req.Header.SetContentType("application/json")
		req.SetBody([]byte(chatBody("a0", strings.Repeat("hello ", 100), false)))
		do := func() {
			if err := hc.Do(req, resp); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode() != 200 || len(resp.Body()) != len(benchReply) || string(resp.Header.Peek("x-rolter-target")) != "p0" {
				t.Fatalf("status %d target %q body %q", resp.StatusCode(), resp.Header.Peek("x-rolter-target"), resp.Body())
			}
		}
		for range 100 {
			do()
		}
		if a := testing.AllocsPerRun(2000, do); a > 1 {
			t.Fatalf("%q: %v allocs per whole adapter request, want at most 1 (fasthttp's body drain)", lora, a)
		}
		want := int64(0) // one load with dynamic_lora, the first request's
		if lora != "" {
			want = 1
		}
		if loads.Load() != want {
			t.Fatalf("%q: %d loads, want %d", lora, loads.Load(), want)
		}
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
	}
}
