package sim

import (
	"testing"

	"github.com/valyala/fasthttp"
)

var (
	sinkTokens []uint32
	sinkBytes  []byte
	sinkInt    int
)

func BenchmarkAppendTokens(b *testing.B) {
	text := []byte(words("bench", 2000))
	dst := make([]uint32, 0, 8192)
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		dst = AppendTokens(dst[:0], text)
	}
	sinkTokens = dst
}

func BenchmarkBlockHashes4k(b *testing.B) {
	tokens := AppendTokens(nil, []byte(words("bench", 2400)))[:4096]
	hashes := make([]blockHash, 0, 256)
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		hashes, buf = appendBlockHashes(hashes[:0], buf, tokens, 16, "")
	}
	sinkInt = len(hashes)
}

func BenchmarkEncodeBlockStored(b *testing.B) {
	tokens := make([]uint32, 256)
	hashes, _ := appendBlockHashes(nil, nil, tokens, 16, "")
	ev := storedEvent{hashes: hashes, tokens: tokens, blockSize: 16}
	for _, era := range []Era{EraMap, EraPositional} {
		b.Run(era.String(), func(b *testing.B) {
			buf := make([]byte, 0, 1<<14)
			b.ReportAllocs()
			for b.Loop() {
				buf = appendBlockStored(buf[:0], eraFormats[era], HashInt, &ev)
			}
			sinkBytes = buf
		})
	}
}

// BenchmarkServeChatCompletion measures the handler of a non-stream chat completion with a
// ~1k-token prompt and zero latency: parse, tokenize, hash, schedule, cache, respond.
func BenchmarkServeChatCompletion(b *testing.B) {
	e, err := New(testConfig())
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"model":"sim-model","messages":[{"role":"user","content":"` + words("bench", 600) + `"}],"max_tokens":8}`)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var req fasthttp.Request
		req.Header.SetMethod("POST")
		req.SetRequestURI("/v1/chat/completions")
		req.SetBody(body)
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, nil, nil)
		for pb.Next() {
			req.CopyTo(&ctx.Request)
			ctx.Response.Reset()
			e.serveHTTP(&ctx)
		}
		sinkInt = ctx.Response.StatusCode()
	})
}
