//go:build !race

package sim

import (
	"testing"

	"github.com/valyala/fasthttp"
)

func TestAllocsTokenizeAndHash(t *testing.T) {
	text := []byte(words("alloc", 500))
	msgs := [][2][]byte{{[]byte("system"), []byte("be brief")}, {[]byte("user"), text}}
	tokens := make([]uint32, 0, 4096)
	hashes := make([]blockHash, 0, 256)
	var buf []byte
	hashes, buf = appendBlockHashes(hashes, buf, AppendTokens(tokens, text), 16, "")
	n := testing.AllocsPerRun(100, func() {
		tokens = AppendTokens(tokens[:0], text)
		tokens = AppendChatTokens(tokens[:0], msgs, true)
		hashes, buf = appendBlockHashes(hashes[:0], buf, tokens, 16, "")
	})
	if n != 0 {
		t.Fatalf("tokenize + hash: %v allocs/op", n)
	}
}

func TestAllocsEventEncoding(t *testing.T) {
	tokens := make([]uint32, 64)
	hashes, _ := appendBlockHashes(nil, nil, tokens, 16, "")
	ev := storedEvent{hashes: hashes[1:], parent: &hashes[0], tokens: tokens[16:], blockSize: 16}
	buf := make([]byte, 0, 4096)
	batch := make([]byte, 0, 4096)
	for _, era := range []Era{EraMap, EraPositional, EraV08} {
		f := eraFormats[era]
		n := testing.AllocsPerRun(100, func() {
			buf = appendBlockStored(buf[:0], f, HashInt, &ev)
			buf = appendBlockRemoved(buf, f, HashBytes, hashes[:1])
			buf = appendAllBlocksCleared(buf, f)
			batch = appendBatch(batch[:0], f, 1.5, buf, 3, 0)
		})
		if n != 0 {
			t.Fatalf("era %s: %v allocs/op", era, n)
		}
	}
}

func TestAllocsCacheRequestCycle(t *testing.T) {
	log := newEventLog(EraMap, HashInt)
	c := newPrefixCache(64, 16, log)
	tokens := make([]uint32, 200)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	hashes, _ := appendBlockHashes(nil, nil, tokens, 16, "")
	held := make([]*block, 0, 32)
	spare := make([]byte, 0, 1<<16)
	cycle := func() {
		hit := c.match(hashes, len(hashes))
		need := blocksFor(len(tokens)+16, 16) - hit
		if !c.fits(hashes, hit, need) {
			t.Fatal("does not fit")
		}
		held = c.pin(held[:0], hashes[:hit])
		c.allocate(need)
		var used int
		held, used = c.store(held, hashes, hit, tokens, nil)
		c.release(held, need-used)
		events, _, _ := log.take(spare)
		spare = events
	}
	cycle()
	if n := testing.AllocsPerRun(100, cycle); n != 0 {
		t.Fatalf("cache request cycle: %v allocs/op", n)
	}
}

// TestAllocsServeCompletion: every endpoint's non-stream handler, and every stream's event builders,
// allocate nothing once warm.
func TestAllocsServeCompletion(t *testing.T) {
	e, err := New(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	prompt := words("hot", 300)
	for path, body := range map[string]string{
		"/v1/chat/completions": `{"model":"sim-model","messages":[{"role":"user","content":"` + prompt + `"}],"max_tokens":8}`,
		"/v1/completions":      `{"model":"sim-model","prompt":"` + prompt + `","max_tokens":8}`,
		"/v1/responses":        `{"model":"sim-model","instructions":"be brief","input":"` + prompt + `","max_output_tokens":8}`,
		"/v1/messages":         `{"model":"sim-model","system":"be brief","messages":[{"role":"user","content":"` + prompt + `"}],"max_tokens":8}`,
		"/v1/embeddings":       `{"model":"sim-model","input":["` + prompt + `","` + prompt + `"],"encoding_format":"base64"}`,
	} {
		var req fasthttp.Request
		req.Header.SetMethod("POST")
		req.SetRequestURI(path)
		req.SetBodyString(body)
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, nil, nil) // allocates its fake connection once
		serve := func() {
			req.CopyTo(&ctx.Request)
			ctx.Response.Reset()
			e.serveHTTP(&ctx)
			if ctx.Response.StatusCode() != 200 {
				t.Fatalf("%s: status %d: %s", path, ctx.Response.StatusCode(), ctx.Response.Body())
			}
		}
		serve()
		if n := testing.AllocsPerRun(100, serve); n != 0 {
			t.Errorf("%s handler: %v allocs/op", path, n)
		}
	}

	r := newRequest(e)
	r.tokens = AppendTokens(r.tokens, []byte(prompt))
	r.maxTokens, r.includeUsage = 8, true
	for _, a := range []api{apiChat, apiCompletions, apiResponses, apiMessages} {
		r.api = a
		e.newID(r, a.idPrefix(), nil)
		build := func() {
			r.out = r.appendOpening(r.out[:0])
			for i := range r.maxTokens {
				r.out = r.appendTokenEvent(r.out, i)
			}
			r.out = r.appendDone(r.appendClosing(r.out))
		}
		build()
		if n := testing.AllocsPerRun(100, build); n != 0 {
			t.Errorf("api %d stream events: %v allocs/op", a, n)
		}
	}
}
