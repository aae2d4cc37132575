package engine

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/rolter-ai/rolter/config"
)

// benchProxy runs a gateway and a zero-delay fasthttp upstream on in-memory listeners and returns a client
// of the gateway.
func benchProxy(b testing.TB, upstream fasthttp.RequestHandler) *fasthttp.HostClient {
	b.Helper()
	return benchProxyExtra(b, upstream, "")
}

// benchProxyExtra is benchProxy with extra config.
func benchProxyExtra(b testing.TB, upstream fasthttp.RequestHandler, extra string) *fasthttp.HostClient {
	b.Helper()
	upLn := fasthttputil.NewInmemoryListener()
	upSrv := &fasthttp.Server{Handler: upstream}
	go upSrv.Serve(upLn) //nolint:errcheck
	b.Cleanup(func() { _ = upSrv.Shutdown() })

	cfg, err := config.Parse([]byte(gatewayConfig("least_load", extra, "http://upstream:80")), "b.toml")
	if err != nil {
		b.Fatal(err)
	}
	g, err := New(cfg, Options{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Dial:   func(string, time.Duration) (net.Conn, error) { return upLn.Dial() },
	})
	if err != nil {
		b.Fatal(err)
	}
	gwLn := fasthttputil.NewInmemoryListener()
	go g.Serve(gwLn) //nolint:errcheck
	b.Cleanup(func() { _ = g.Shutdown(contextDone()) })
	return &fasthttp.HostClient{Addr: "gateway", Dial: func(string) (net.Conn, error) { return gwLn.Dial() }, MaxConns: 1024}
}

const benchReply = `{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`

// BenchmarkProxyRequest is one whole non-streaming chat request through the gateway (client -> gateway ->
// upstream -> gateway -> client) over in-memory listeners, in parallel.
func BenchmarkProxyRequest(b *testing.B) {
	hc := benchProxy(b, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(benchReply)
	})
	body := []byte(chatBody("m", strings.Repeat("hello ", 100), false))
	b.ReportAllocs()
	cpu := cpuNow()
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.Header.SetMethod("POST")
		req.SetRequestURI("http://gateway/v1/chat/completions")
		req.Header.SetContentType("application/json")
		req.SetBody(body)
		for pb.Next() {
			if err := hc.Do(req, resp); err != nil {
				b.Fatal(err)
			}
			if resp.StatusCode() != 200 || len(resp.Body()) != len(benchReply) {
				b.Fatalf("status %d body %q", resp.StatusCode(), resp.Body())
			}
		}
	})
	reportCPU(b, cpu)
}

// BenchmarkProxyRequestObserved is BenchmarkProxyRequest with the access log and tracing off, then on: a
// JSON line per request to a file, and spans (at the default sample ratio 0.1, then at 1) to an OTLP/HTTP
// receiver on loopback.
func BenchmarkProxyRequestObserved(b *testing.B) {
	collector := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(200) }}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go collector.Serve(ln) //nolint:errcheck
	b.Cleanup(func() { _ = collector.Shutdown() })
	logPath := b.TempDir() + "/access.log"
	for _, c := range []struct{ name, extra string }{
		{"off", ""},
		{"log", fmt.Sprintf("[log]\naccess = %q\n", logPath)},
		{"log+trace0.1", fmt.Sprintf("[log]\naccess = %q\n[tracing]\nendpoint = \"http://%s\"\n", logPath, ln.Addr())},
		{"log+trace1", fmt.Sprintf("[log]\naccess = %q\n[tracing]\nendpoint = \"http://%s\"\nsample_ratio = 1\n", logPath, ln.Addr())},
	} {
		b.Run(c.name, func(b *testing.B) {
			hc := benchProxyExtra(b, func(ctx *fasthttp.RequestCtx) {
				ctx.SetContentType("application/json")
				ctx.SetBodyString(benchReply)
			}, c.extra)
			body := []byte(chatBody("m", strings.Repeat("hello ", 100), false))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				req.Header.SetMethod("POST")
				req.SetRequestURI("http://gateway/v1/chat/completions")
				req.Header.SetContentType("application/json")
				req.SetBody(body)
				for pb.Next() {
					if err := hc.Do(req, resp); err != nil {
						b.Fatal(err)
					}
					if resp.StatusCode() != 200 {
						b.Fatalf("status %d body %q", resp.StatusCode(), resp.Body())
					}
				}
			})
		})
	}
}

// BenchmarkProxyStream is one whole SSE chat request of 16 events through the gateway.
func BenchmarkProxyStream(b *testing.B) {
	event := []byte(`data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok"}}]}` + "\n\n")
	hc := benchProxy(b, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for i := 0; i < 16; i++ {
				w.Write(event)
				w.Flush()
			}
			w.WriteString("data: [DONE]\n\n")
		})
	})
	body := []byte(chatBody("m", strings.Repeat("hello ", 100), true))
	b.ReportAllocs()
	cpu := cpuNow()
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.Header.SetMethod("POST")
		req.SetRequestURI("http://gateway/v1/chat/completions")
		req.Header.SetContentType("application/json")
		req.SetBody(body)
		for pb.Next() {
			if err := hc.Do(req, resp); err != nil {
				b.Fatal(err)
			}
			if !strings.HasSuffix(string(resp.Body()), "data: [DONE]\n\n") {
				b.Fatalf("stream %q", resp.Body())
			}
		}
	})
	reportCPU(b, cpu)
}
