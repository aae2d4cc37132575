package sim

import (
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

func (e *Engine) serveHTTP(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	post := ctx.IsPost()
	get := ctx.IsGet()
	switch string(path) {
	case "/v1/chat/completions":
		if post {
			e.serveCompletion(ctx, apiChat)
			return
		}
	case "/v1/completions":
		if post {
			e.serveCompletion(ctx, apiCompletions)
			return
		}
	case "/v1/responses":
		if post {
			e.serveCompletion(ctx, apiResponses)
			return
		}
	case "/v1/messages":
		if post {
			e.serveCompletion(ctx, apiMessages)
			return
		}
	case "/v1/embeddings":
		if post {
			e.serveEmbeddings(ctx)
			return
		}
	case "/tokenize":
		if post {
			e.serveTokenize(ctx)
			return
		}
	case "/v1/load_lora_adapter", "/v1/unload_lora_adapter":
		if !e.cfg.AllowRuntimeLoRA {
			notFound(ctx) // not mounted
			return
		}
		if post {
			if string(path) == "/v1/load_lora_adapter" {
				e.serveLoadLoRA(ctx)
			} else {
				e.serveUnloadLoRA(ctx)
			}
			return
		}
	case "/v1/models":
		if get {
			e.serveModels(ctx)
			return
		}
	case "/health":
		if get {
			ctx.SetStatusCode(fasthttp.StatusOK)
			return
		}
	case "/metrics":
		if get {
			ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
			ctx.SetBody(e.appendMetrics(nil))
			return
		}
	case "/lmcache/status":
		if get {
			e.serveLMCacheStatus(ctx)
			return
		}
	case "/version":
		if get {
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"version":"rolter-sim"}`)
			return
		}
	default:
		notFound(ctx)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"detail":"Method Not Allowed"}`)
}

// notFound is FastAPI's answer to unknown paths.
func notFound(ctx *fasthttp.RequestCtx) {
	ctx.SetStatusCode(fasthttp.StatusNotFound)
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"detail":"Not Found"}`)
}

func writeError(ctx *fasthttp.RequestCtx, e *apiError) {
	ctx.SetStatusCode(e.status)
	ctx.SetContentType("application/json")
	ctx.SetBody(appendErrorBody(nil, e))
}

// writeErrorFor writes e in the shape of the endpoint that was asked: Anthropic's for /v1/messages,
// vLLM's OpenAI shape for the others.
func writeErrorFor(ctx *fasthttp.RequestCtx, a api, e *apiError) {
	if a != apiMessages {
		writeError(ctx, e)
		return
	}
	ctx.SetStatusCode(e.status)
	ctx.SetContentType("application/json")
	ctx.SetBody(appendAnthropicError(nil, e))
}

var errStopping = &apiError{status: 503, typ: "ServiceUnavailableError", msg: "the engine is shutting down"}

func (e *Engine) serveCompletion(ctx *fasthttp.RequestCtx, a api) {
	e.requests.Add(1)
	if e.stopped() {
		ctx.SetConnectionClose()
		writeErrorFor(ctx, a, errStopping)
		return
	}
	r := e.getRequest()
	if ae := r.parse(ctx.PostBody(), a, &e.cfg); ae != nil {
		e.putRequest(r)
		writeErrorFor(ctx, a, ae)
		return
	}
	requestID := ctx.Request.Header.Peek("X-Request-Id")
	if len(requestID) > 0 {
		ctx.Response.Header.SetBytesV("X-Request-Id", requestID)
	}
	e.newID(r, a.idPrefix(), requestID)
	r.created = time.Now().Unix()
	r.conn = ctx.Conn()
	e.hashPrompt(r)

	f := e.faults.Load()
	if f.AddedLatency > 0 && !e.pause(r, f.AddedLatency) {
		e.abandon(ctx, r)
		return
	}
	if e.injectError(f.ErrorRate) {
		e.errorsSent.Add(1)
		e.putRequest(r)
		writeErrorFor(ctx, a, &apiError{status: 500, typ: "InternalServerError", msg: "simulated engine failure (fault injection)"})
		return
	}
	if f.HangBeforeHeaders {
		e.hang(r)
		e.abandon(ctx, r)
		return
	}
	if r.boot.set && e.cfg.Role.decodes() && !r.stream {
		ae, ok := e.fetchRoom(r)
		if !ok {
			e.abandon(ctx, r)
			return
		}
		if ae != nil {
			e.putRequest(r)
			writeErrorFor(ctx, a, ae)
			return
		}
	}
	if ae := e.pullRemote(r); ae != nil {
		if !r.stream {
			e.putRequest(r)
			writeErrorFor(ctx, a, ae)
			return
		}
		r.pullErr = ae // vLLM streams the error as an event of its own
	}
	if r.stream {
		r.abortAfter = f.AbortAfterChunks
		if r.abortAfter > 0 {
			ctx.SetConnectionClose()
		}
		ctx.SetContentType("text/event-stream; charset=utf-8")
		// Like vLLM's StreamingResponse, headers go out at once; tokens follow as they come.
		ctx.Response.ImmediateHeaderFlush = true
		ctx.SetBodyStream(r, -1)
		return
	}
	if !e.generate(r) {
		e.abandon(ctx, r)
		return
	}
	if r.room != nil {
		// SGLang's prefill server answers once the decode engine has read the blocks.
		ae, ok := e.awaitRoom(r)
		if !ok {
			e.abandon(ctx, r)
			return
		}
		if ae != nil {
			e.putRequest(r)
			writeErrorFor(ctx, a, ae)
			return
		}
	}
	e.completed.Add(1)
	ctx.SetContentType("application/json")
	r.out = r.appendFull(r.out[:0])
	ctx.SetBody(r.out)
	e.putRequest(r)
}

// abandon ends a request that will not be answered: the client went away (the connection is
// closed without a response) or the engine stops (503).
func (e *Engine) abandon(ctx *fasthttp.RequestCtx, r *request) {
	e.finish(r)
	ctx.SetConnectionClose()
	if e.stopped() && !r.gone {
		writeError(ctx, errStopping)
	} else {
		e.disconnects.Add(1)
	}
	e.putRequest(r)
}

type streamPhase uint8

const (
	phAdmit streamPhase = iota
	phTokens
	phUsage
	phDone
	phEOF
)

var errStreamEnded = errors.New("stream ended: client gone or engine stopping")

// Read produces the SSE body of a stream request, one event per call, waiting as the latency
// model says. The fasthttp server calls it from the connection's goroutine after the handler
// returned, and flushes after every call.
func (r *request) Read(p []byte) (int, error) {
	for r.outPos >= len(r.out) {
		r.out, r.outPos = r.out[:0], 0
		if err := r.nextEvent(); err != nil {
			return 0, err
		}
	}
	n := copy(p, r.out[r.outPos:])
	r.outPos += n
	return n, nil
}

func (r *request) nextEvent() error {
	e := r.e
	if r.phase != phEOF && r.abortAfter > 0 && r.chunks >= r.abortAfter {
		// Fault: the stream ends here without [DONE]; the connection closes after it.
		e.finish(r)
		e.aborts.Add(1)
		r.phase = phEOF
	}
	switch r.phase {
	case phAdmit:
		if r.pullErr == nil && r.boot.set && e.cfg.Role.decodes() {
			ae, ok := e.fetchRoom(r)
			if !ok {
				return errStreamEnded
			}
			r.pullErr = ae
		}
		if r.pullErr != nil {
			r.appendStreamError(r.pullErr)
			break
		}
		if !e.admit(r) || !e.pause(r, r.prefill) {
			return errStreamEnded
		}
		e.prefilled(r)
		if r.boot.set && e.cfg.Role.prefills() {
			// SGLang's prefill streams its one token once the decode engine has read the blocks.
			e.complete(r)
			ae, ok := e.awaitRoom(r)
			if !ok {
				return errStreamEnded
			}
			if ae != nil {
				r.appendStreamError(ae)
				break
			}
		}
		r.phase = phTokens
		if r.out = r.appendOpening(r.out); len(r.out) > 0 {
			break
		}
		return r.nextEvent()
	case phTokens:
		if r.tokenIdx > 0 && !e.pause(r, e.cfg.DecodePerToken) {
			return errStreamEnded
		}
		r.out = r.appendTokenEvent(r.out, r.tokenIdx)
		r.tokenIdx++
		if r.tokenIdx == r.maxTokens {
			e.complete(r)
			e.completed.Add(1)
			r.phase = phUsage
		}
	case phUsage:
		r.phase = phDone
		if r.out = r.appendClosing(r.out); len(r.out) == 0 {
			return r.nextEvent()
		}
	case phDone:
		r.phase = phEOF
		if r.out = r.appendDone(r.out); len(r.out) == 0 {
			return io.EOF
		}
	default:
		return io.EOF
	}
	r.chunks++
	return nil
}

// appendStreamError ends r's stream with one error event, then [DONE], as vLLM and SGLang stream
// the errors of a request that already has its headers.
func (r *request) appendStreamError(ae *apiError) {
	r.e.finish(r)
	r.out = append(r.out, "data: "...)
	r.out = appendErrorBody(r.out, ae)
	r.out = append(r.out, "\n\n"...)
	r.phase = phDone
}

// CloseWithError is called by the fasthttp server once the stream is over; err is the write
// error when the client went away. r goes back to the pool.
func (r *request) CloseWithError(error) error {
	e := r.e
	if r.phase != phEOF && !e.stopped() {
		e.disconnects.Add(1) // the client went away before the end
	}
	e.finish(r)
	e.putRequest(r)
	return nil
}

func (e *Engine) serveTokenize(ctx *fasthttp.RequestCtx) {
	r := e.getRequest()
	defer e.putRequest(r)
	if ae := r.parseTokenize(ctx.PostBody(), &e.cfg); ae != nil {
		writeError(ctx, ae)
		return
	}
	b := append(r.out[:0], `{"count":`...)
	b = strconv.AppendInt(b, int64(len(r.tokens)), 10)
	b = append(b, `,"max_model_len":`...)
	b = strconv.AppendInt(b, int64(e.cfg.MaxModelLen), 10)
	b = append(b, `,"tokens":[`...)
	for i, t := range r.tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(t), 10)
	}
	b = append(b, `],"token_strs":null}`...)
	r.out = b
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// serveModels lists the base model, then one card per registered LoRA adapter, as vLLM's
// show_available_models does (root: the adapter's path, parent: the base model,
// max_model_len: null).
func (e *Engine) serveModels(ctx *fasthttp.RequestCtx) {
	b := append([]byte(nil), `{"object":"list","data":[`...)
	b = e.appendModelCard(b, e.modelJSON, e.modelJSON, nil, true)
	if e.cfg.EnableLoRA {
		e.mu.Lock()
		for _, a := range e.lora.list {
			b = append(b, ',')
			b = e.appendModelCard(b, a.nameJSON, appendJSONString(nil, a.path), e.modelJSON, false)
		}
		e.mu.Unlock()
	}
	b = append(b, `]}`...)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// appendModelCard appends one ModelCard; a nil parent is null, and only the base model has a
// max_model_len.
func (e *Engine) appendModelCard(b, id, root, parent []byte, base bool) []byte {
	b = append(b, `{"id":`...)
	b = append(b, id...)
	b = append(b, `,"object":"model","created":`...)
	b = strconv.AppendInt(b, int64(e.createdAt), 10)
	b = append(b, `,"owned_by":"vllm","root":`...)
	b = append(b, root...)
	b = append(b, `,"parent":`...)
	if parent == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, parent...)
	}
	b = append(b, `,"max_model_len":`...)
	if base {
		b = strconv.AppendInt(b, int64(e.cfg.MaxModelLen), 10)
	} else {
		b = append(b, "null"...)
	}
	return append(b, '}')
}

// serveLMCacheStatus answers {"occupancy": cached blocks / capacity, "cache_available": the
// cache can take another block (free or evictable)}.
func (e *Engine) serveLMCacheStatus(ctx *fasthttp.RequestCtx) {
	e.mu.Lock()
	cached := e.cache.cachedBlocks()
	available := e.cache.free+e.cache.lruLen > 0
	e.mu.Unlock()
	b := append([]byte(nil), `{"occupancy":`...)
	b = strconv.AppendFloat(b, float64(cached)/float64(e.cfg.NumBlocks), 'f', -1, 64)
	b = append(b, `,"cache_available":`...)
	b = strconv.AppendBool(b, available && !e.stopped())
	b = append(b, '}')
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
