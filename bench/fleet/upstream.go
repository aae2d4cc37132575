package fleet

import (
	"bufio"
	"bytes"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// UpstreamConfig shapes the fake upstream of the overhead report.
type UpstreamConfig struct {
	// Chunks is the number of content deltas of a streamed answer (64).
	Chunks int
	// Gap is the time between two deltas (20ms), the onthebench stream mock's pace.
	Gap time.Duration
}

// instantBody is the whole answer of a non-streamed request: a minimal OpenAI chat completion.
var instantBody = []byte(`{"id":"chatcmpl-bench","object":"chat.completion","created":1,"model":"fake","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10,"prompt_tokens_details":{"cached_tokens":0}}}`)

var (
	RoleEvent   = []byte("data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"model\":\"fake\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n")
	deltaPrefix = []byte("data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"model\":\"fake\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"")
	deltaSuffix = []byte("\"},\"finish_reason\":null}]}\n\n")
	FinishEvent = []byte("data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"model\":\"fake\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n")
	doneEvent   = []byte("data: [DONE]\n\n")
)

// NewFakeUpstream returns the handler of the overhead report's upstream: a zero-delay
// OpenAI-compatible server. A POST whose body asks for "stream": true gets a paced SSE answer
// (a role chunk at once, then cfg.Chunks deltas cfg.Gap apart - fewer if its "max_tokens" asks
// for fewer - each carrying its send time in unix nanoseconds as its content, then a finish chunk
// and [DONE]); any other POST gets instantBody at once. GET /health and /healthz answer 200.
func NewFakeUpstream(cfg UpstreamConfig) fasthttp.RequestHandler {
	if cfg.Chunks <= 0 {
		cfg.Chunks = 64
	}
	if cfg.Gap <= 0 {
		cfg.Gap = 20 * time.Millisecond
	}
	return func(ctx *fasthttp.RequestCtx) {
		if !ctx.IsPost() {
			ctx.SetContentType("text/plain")
			ctx.SetBodyString("ok")
			return
		}
		body := ctx.PostBody()
		if !bytes.Contains(body, []byte(`"stream":true`)) && !bytes.Contains(body, []byte(`"stream": true`)) {
			ctx.SetContentType("application/json")
			ctx.SetBody(instantBody)
			return
		}
		chunks := cfg.Chunks
		if n := maxTokens(body); n > 0 && n < chunks {
			chunks = n
		}
		ctx.SetContentType("text/event-stream")
		ctx.Response.Header.Set("Cache-Control", "no-cache")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			start := time.Now()
			if _, err := w.Write(RoleEvent); err != nil || w.Flush() != nil {
				return
			}
			var buf []byte
			for i := 1; i <= chunks; i++ {
				// Pace against the start, not the previous write, so jitter does not accumulate.
				time.Sleep(time.Until(start.Add(time.Duration(i) * cfg.Gap)))
				buf = append(buf[:0], deltaPrefix...)
				buf = strconv.AppendInt(buf, time.Now().UnixNano(), 10)
				buf = append(buf, deltaSuffix...)
				if _, err := w.Write(buf); err != nil || w.Flush() != nil {
					return // the client went away
				}
			}
			_, _ = w.Write(FinishEvent)
			_, _ = w.Write(doneEvent)
			_ = w.Flush()
		})
	}
}

// maxTokens returns the number after the body's first "max_tokens":, or 0.
func maxTokens(body []byte) int {
	key := []byte(`"max_tokens":`)
	i := bytes.Index(body, key)
	if i < 0 {
		return 0
	}
	rest := bytes.TrimLeft(body[i+len(key):], " ")
	j := 0
	for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
		j++
	}
	n, _ := strconv.Atoi(string(rest[:j]))
	return n
}

// ServeFakeUpstream serves NewFakeUpstream(cfg) on a loopback port and returns its address and the
// function that stops it.
func ServeFakeUpstream(cfg UpstreamConfig) (addr string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &fasthttp.Server{Handler: NewFakeUpstream(cfg), CloseOnShutdown: true}
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() { _ = srv.Shutdown() }, nil
}
