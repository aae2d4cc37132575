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
// call and request context, to show how the routing path scales with -cpu (issue 19: no cache line written
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
						snap := g.acquireSnapshot()
						g.inflight.Add(1)
						c = g.acquireCall(snap)
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

// denseBody is 1 MiB of small values, the shape that costs a value tree the most per byte.
var denseBody = `{"model":"m","messages":[{"role":"user","content":"hi"}],"x":[` + strings.Repeat("1,", 512<<10-40) + `1]}`

// ascii8KiB is one user message of 8 KiB of English, escapes and all: the overhead report's cache_aware
// case.
var ascii8KiB = `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("The model answers a question about routing, cache and prefix. ", 130) + `"}],"max_tokens":8}`

// requestBodies are the bodies the request scanner is measured on.
var requestBodies = []struct {
	name string
	body string
}{
	{"chat8KiB", chat20},
	{"ascii8KiB", ascii8KiB},
	{"chat128KiB", chatTurns(353)},
	{"dense1MiB", denseBody},
}

// BenchmarkScanRequest measures validating a chat body and reading its model, stream flag and prompt key.
func BenchmarkScanRequest(b *testing.B) {
	for _, rb := range requestBodies {
		b.Run(rb.name, func(b *testing.B) {
			body := []byte(rb.body)
			var s requestScanner
			var info requestInfo
			s.scan(body, epChat, nil, &info) // grows the key buffer
			key := info.key
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if e := s.scan(body, epChat, key[:0], &info); e != nil {
					b.Fatal(e.message)
				}
				key = info.key
			}
			Sink.Add(int64(len(info.key)))
		})
	}
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

// shapeBodies are the request shapes of issue 17 the scanner is measured on: the other APIs' bodies, a salted
// one, and one whose parts come out of order (input before instructions: moved into place).
var shapeBodies = func() []struct {
	name string
	ep   endpoint
	body string
} {
	var input, msgs strings.Builder
	for i := 1; i < 20; i++ {
		role, typ := "user", "input_text"
		if i%2 == 0 {
			role, typ = "assistant", "output_text"
		}
		if i > 1 {
			input.WriteByte(',')
			msgs.WriteByte(',')
		}
		text := fmt.Sprintf("turn %d: %s", i, strings.Repeat("lorem ipsum \u00e9 ", 20))
		fmt.Fprintf(&input, `{"type":"message","role":%q,"content":[{"type":%q,"text":%q}]}`, role, typ, text)
		fmt.Fprintf(&msgs, `{"role":%q,"content":[{"type":"text","text":%q}]}`, role, text)
	}
	system := strings.Repeat("You are a helpful assistant. ", 40)
	return []struct {
		name string
		ep   endpoint
		body string
	}{
		{"responses8KiB", epResponses, `{"model":"m","stream":true,"prompt_cache_key":"conv-\u0031","instructions":"` + system + `","input":[` + input.String() + `]}`},
		{"responsesReordered", epResponses, `{"model":"m","input":[` + input.String() + `],"instructions":"` + system + `","cache_salt":"s\u00e9"}`},
		{"messages8KiB", epMessages, `{"model":"m","max_tokens":128,"system":[{"type":"text","text":"` + system + `"}],"messages":[` + msgs.String() + `]}`},
		{"chatSalted8KiB", epChat, strings.Replace(chat20, `"model":"m"`, `"model":"m","cache_salt":"tenant-1","user":"alice"`, 1)},
	}
}()

// BenchmarkScanRequestShapes is BenchmarkScanRequest for the other request shapes (shapeBodies).
func BenchmarkScanRequestShapes(b *testing.B) {
	for _, sb := range shapeBodies {
		b.Run(sb.name, func(b *testing.B) {
			body := []byte(sb.body)
			s := requestScanner{keyFields: []string{"user"}}
			var info requestInfo
			s.scan(body, sb.ep, nil, &info)
			key := info.key
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if e := s.scan(body, sb.ep, key[:0], &info); e != nil {
					b.Fatal(e.message)
				}
				key = info.key
			}
			Sink.Add(int64(len(info.key) + info.opening))
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
