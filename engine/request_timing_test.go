package engine

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/config"
)

// Sink keeps benchmark results alive.
var Sink atomic.Int64

// cpuNow returns the CPU time (user and system) the process has used so far.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process's CPU time per op since start (a cpuNow reading) as cpu-ns/op. With
// RunParallel on a shared machine, ns/op (wall time) also rises when other processes take the cores; the CPU
// time per op rises only when each op costs more (a cache line bouncing between cores, a contended lock), so
// it is the figure to compare across -cpu (bench/results/scaling.md). It counts the whole process: GC and
// the gateway's background goroutines too.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuNow()-start)/float64(b.N), "cpu-ns/op")
}

// chat20 is a chat body of 20 messages (system prompt, 19 turns, ~8 KiB).
var chat20 = chatTurns(20)

// benchCall returns a gateway over 8 targets with the given strategy and a request context holding chat20.
func benchCall(t testing.TB, strategy string) (*Gateway, *fasthttp.RequestCtx) {
	t.Helper()
	return benchCallExtra(t, strategy, "")
}

// benchCallExtra is benchCall with extra config after the route.
func benchCallExtra(t testing.TB, strategy, extra string) (*Gateway, *fasthttp.RequestCtx) {
	t.Helper()
	urls := make([]string, 8)
	for i := range urls {
		urls[i] = fmt.Sprintf("http://127.0.0.1:%d", 20000+i)
	}
	cfg, err := config.Parse([]byte(gatewayConfig(strategy, extra, urls...)), "b.toml")
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Shutdown(contextDone()) })
	ctx := &fasthttp.RequestCtx{}
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.Header.SetContentType("application/json")
	ctx.Request.SetRequestURI("/v1/chat/completions")
	ctx.Request.SetBodyString(chat20)
	return g, ctx
}

// BenchmarkRoutingPath measures body parse + prompt key + route lookup + pick for a 20-message chat body.
func BenchmarkRoutingPath(b *testing.B) {
	for _, strategy := range []string{"round_robin", "least_load", "weighted"} {
		b.Run(strategy, func(b *testing.B) {
			g, ctx := benchCall(b, strategy)
			loopRoutingPath(b, g, ctx)
		})
	}
}

// loopRoutingPath runs the request path up to the pick on one call of g, b.N times.
func loopRoutingPath(b *testing.B, g *Gateway, ctx *fasthttp.RequestCtx) {
	c := g.acquireCall(g.acquireSnapshot())
	b.ReportAllocs()
	b.SetBytes(int64(len(ctx.Request.Body())))
	for b.Loop() {
		c.route = nil
		if e := readAndPrepare(c, ctx); e != nil {
			b.Fatal(e.message)
		}
	}
	Sink.Add(int64(c.order[0]))
}

// BenchmarkRoutingPathParallel is BenchmarkRoutingPath from every core at once, each goroutine with its own
// call and request context, to show how the routing path scales with -cpu (no cache line written
// per request by all cores unless measured to be harmless). The "+routed" cases add the strategy's record of
// the pick (the trie insert under the target's lock; pipeline's hot_window ring), as attempt does at send
// time; "+call" adds the call's life around it (the snapshot's user count, the gateway's in-flight count and
// body memory, the call pool), as post and release do. Results: bench/results/scaling.md.
func BenchmarkRoutingPathParallel(b *testing.B) {
	for _, tc := range []struct {
		strategy     string
		routed, call bool
	}{
		{strategy: "round_robin"},
		{strategy: "least_load"},
		{strategy: "weighted"},
		{strategy: "cache_aware"},
		{strategy: "pipeline"},
		{strategy: "cache_aware", routed: true},
		{strategy: "pipeline", routed: true},
		{strategy: "round_robin", call: true},
	} {
		name := tc.strategy
		if tc.routed {
			name += "+routed"
		}
		if tc.call {
			name += "+call"
		}
		b.Run(name, func(b *testing.B) {
			g, _ := benchCall(b, tc.strategy)
			b.ReportAllocs()
			b.SetBytes(int64(len(chat20)))
			cpu := cpuNow()
			b.RunParallel(func(pb *testing.PB) {
				ctx := &fasthttp.RequestCtx{}
				ctx.Request.Header.SetMethod("POST")
				ctx.Request.Header.SetContentType("application/json")
				ctx.Request.SetRequestURI("/v1/chat/completions")
				ctx.Request.SetBodyString(chat20)
				var c *call
				if !tc.call {
					c = g.acquireCall(g.acquireSnapshot())
				}
				sum := 0
				for pb.Next() {
					if tc.call {
						c = g.acquireCall(g.acquireSnapshot())
						c.admitGlobal()
					}
					c.route = nil
					if e := readAndPrepare(c, ctx); e != nil {
						b.Fatal(e.message)
					}
					if tc.routed {
						c.route.recorder.Routed(&c.pick, c.order[0])
					}
					sum += c.order[0]
					if tc.call {
						c.release()
					}
				}
				Sink.Add(int64(sum))
			})
			reportCPU(b, cpu)
		})
	}
}

// BenchmarkRoutingPathPeers is cache_aware's routing path with and without the peers' evidence (the
// checkpoints of the key and one lookup per target).
func BenchmarkRoutingPathPeers(b *testing.B) {
	for _, peers := range []bool{false, true} {
		b.Run(map[bool]string{false: "none", true: "peers"}[peers], func(b *testing.B) {
			g, ctx := benchCall(b, "cache_aware")
			if peers {
				g.SetPeers(heldPeers(3))
			}
			loopRoutingPath(b, g, ctx)
		})
	}
}

// chatTurns returns a chat body of n messages: a system prompt, then user and assistant turns of ~370 bytes
// with array content.
func chatTurns(n int) string {
	var b strings.Builder
	b.WriteString(`{"model":"m","stream":true,"messages":[{"role":"system","content":"` + strings.Repeat("You are a helpful assistant. ", 40) + `"}`)
	for i := 1; i < n; i++ {
		role := "user"
		if i%2 == 0 {
			role = "assistant"
		}
		fmt.Fprintf(&b, `,{"role":%q,"content":[{"type":"text","text":"turn %d: %s"}]}`, role, i, strings.Repeat("lorem ipsum \u00e9 ", 20))
	}
	b.WriteString(`],"max_tokens":128}`)
	return b.String()
}

// BenchmarkRoutingPathShadows is BenchmarkRoutingPath for cache_aware without and with two shadow
// strategies: the shadows' work is off the request path, so the two should be within noise of each other
// (each request still copies its prompt key to the shadows and queues its end).
func BenchmarkRoutingPathShadows(b *testing.B) {
	for _, shadows := range []string{"", `["pipeline", "consistent_hash"]`} {
		name := "none"
		extra := ""
		if shadows != "" {
			name, extra = "two", "[routes.shadow]\nstrategies = "+shadows+"\n"
		}
		b.Run(name, func(b *testing.B) {
			g, ctx := benchCallExtra(b, "cache_aware", extra)
			c := g.acquireCall(g.acquireSnapshot())
			b.ReportAllocs()
			b.SetBytes(int64(len(chat20)))
			for b.Loop() {
				c.route = nil
				if e := readAndPrepare(c, ctx); e != nil {
					b.Fatal(e.message)
				}
				c.endShadow(c.order[0], true)
			}
			Sink.Add(int64(c.order[0]))
		})
	}
}

// BenchmarkRoutingPathHash is BenchmarkRoutingPath for consistent_hash, which hashes the conversation's
// opening (system prompt and first user turn) instead of its first 256 bytes.
func BenchmarkRoutingPathHash(b *testing.B) {
	g, ctx := benchCall(b, "consistent_hash")
	c := g.acquireCall(g.acquireSnapshot())
	b.ReportAllocs()
	b.SetBytes(int64(len(chat20)))
	for b.Loop() {
		c.route = nil
		if e := readAndPrepare(c, ctx); e != nil {
			b.Fatal(e.message)
		}
	}
	Sink.Add(int64(c.order[0]))
}
