package sim

import (
	"math"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fastjson"
)

// request is one completion request from parse to the last byte. It is pooled: the handler
// owns it until it returns, except for streams, where the fasthttp server owns it as the body
// stream until CloseWithError.
type request struct {
	e *Engine

	api          api // which endpoint asked: the shape of the answer
	stream       bool
	includeUsage bool
	maxTokens    int
	explicitMax  bool // finish_reason "length" when max_tokens was given, else "stop" (EOS)
	tokens       []uint32
	hashes       []blockHash
	cborBuf      []byte
	partsBuf     []byte
	id           []byte // "chatcmpl-…" or "cmpl-…"
	created      int64

	conn      net.Conn // polled for a closed client while waiting
	lastAlive time.Time
	timer     *time.Timer
	ready     chan struct{} // capacity 1: admitted

	// Scheduler state, under Engine.mu.
	state   reqState
	next    *request // waiting FIFO link
	held    []*block
	private int
	hit     int // cached blocks found at admission
	cached  int // prompt tokens not computed: local hits, and blocks read from a prefill engine
	prefill time.Duration
	// lora is the adapter the request named (nil: the base model); loraBlocked marks a waiting
	// request that only its adapter keeps out.
	lora        *loraAdapter
	loraBlocked bool

	// Disaggregated serving: the request's kv_transfer_params; on a decode engine the blocks
	// [pulledStart, pulledEnd) read from the prefill engine; on a prefill engine the blocks
	// offered and the key of their hold.
	kv                     kvParams
	pulledStart, pulledEnd int
	// SGLang's protocol: the bootstrap members; on a prefill engine the room holding the blocks,
	// on a decode engine the cached_tokens the prefill engine reported (-1: not a room request).
	boot         bootParams
	room         *room
	reportCached int
	offerIDs     []uint32
	offerKey     string
	pullErr      *apiError // a failed pull, told in the stream

	// Stream state, touched only by the goroutine serving the response.
	phase      streamPhase
	out        []byte
	outPos     int
	tokenIdx   int
	chunks     int
	abortAfter int
	seq        int // the next sequence_number of a Responses stream event
	gone       bool

	// An embeddings request: where each input's tokens end in tokens, the vector length, the encoding,
	// and the vector being written.
	inputEnds []int
	dims      int
	base64    bool
	vec       []float64
}

type reqState uint8

const (
	stIdle reqState = iota
	stWaiting
	stRunning
	stDone
)

func newRequest(e *Engine) *request {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &request{e: e, timer: t, ready: make(chan struct{}, 1), reportCached: -1}
}

func (r *request) reset() {
	r.api, r.stream, r.includeUsage, r.explicitMax = apiCompletions, false, false, false
	r.maxTokens = 0
	r.tokens = r.tokens[:0]
	r.hashes = r.hashes[:0]
	r.id = r.id[:0]
	r.created = 0
	r.conn = nil
	r.lastAlive = time.Time{}
	r.state = stIdle
	r.next = nil
	r.held = r.held[:0]
	r.private, r.hit, r.cached, r.prefill = 0, 0, 0, 0
	r.lora, r.loraBlocked = nil, false
	r.kv.reset()
	r.boot.reset()
	r.room, r.reportCached = nil, -1
	r.pulledStart, r.pulledEnd = 0, 0
	r.offerIDs, r.offerKey, r.pullErr = r.offerIDs[:0], "", nil
	r.phase = 0
	r.out = r.out[:0]
	r.outPos, r.tokenIdx, r.chunks, r.abortAfter, r.seq = 0, 0, 0, 0, 0
	r.gone = false
	r.inputEnds, r.dims, r.base64, r.vec = r.inputEnds[:0], 0, false, r.vec[:0]
	select {
	case <-r.ready:
	default:
	}
}

// apiError is an error answered in vLLM's shape.
type apiError struct {
	status int
	typ    string
	msg    string
	sglang bool // answered in SGLang's ErrorResponse shape: the request spoke SGLang's protocol
}

func badRequest(msg string) *apiError {
	return &apiError{status: 400, typ: "BadRequestError", msg: msg}
}

var parserPool fastjson.ParserPool

// api is the endpoint of a generation request; each answers in its own shape.
type api uint8

const (
	apiCompletions api = iota // POST /v1/completions
	apiChat                   // POST /v1/chat/completions
	apiResponses              // POST /v1/responses (OpenAI's Responses API)
	apiMessages               // POST /v1/messages (Anthropic's Messages API)
)

// idPrefix is the start of the answer's id, as vLLM names them.
func (a api) idPrefix() string {
	switch a {
	case apiChat:
		return "chatcmpl-"
	case apiResponses:
		return "resp_"
	case apiMessages:
		return "msg_"
	}
	return "cmpl-"
}

// parse reads the body of a generation request of kind a and tokenizes its prompt.
func (r *request) parse(body []byte, a api, cfg *Config) *apiError {
	switch a {
	case apiResponses:
		return r.parseResponses(body, cfg)
	case apiMessages:
		return r.parseMessages(body, cfg)
	}
	return r.parseCompletion(body, a == apiChat, cfg)
}

// parseCompletion reads a chat or completions body and tokenizes its prompt.
func (r *request) parseCompletion(body []byte, chat bool, cfg *Config) *apiError {
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, e := r.parseObject(p, body, cfg)
	if e != nil {
		return e
	}
	r.api = apiCompletions
	if chat {
		r.api = apiChat
	}
	r.stream = v.GetBool("stream")
	r.includeUsage = v.GetBool("stream_options", "include_usage")
	if e := r.readMaxTokens(v, cfg, "max_completion_tokens", "max_tokens"); e != nil {
		return e
	}
	if cfg.Role != RoleAggregated {
		// A body with bootstrap_room speaks SGLang's protocol; kv_transfer_params are vLLM's.
		if e := r.parseBootstrap(v, cfg.Role); e != nil {
			return e
		}
		if !r.boot.set {
			if e := r.parseKVParams(v); e != nil {
				return e
			}
		} else if cfg.Role.prefills() {
			// SGLang's prefill server generates one token whatever the body asks
			// (PrefillBootstrapQueue._process_req sets max_new_tokens = 1) and ends FINISH_LENGTH.
			r.maxTokens, r.explicitMax = 1, true
		}
	}
	if chat {
		if e := r.tokenizeMessages(v, true); e != nil {
			return e
		}
	} else if e := r.tokenizePrompt(v); e != nil {
		return e
	}
	return r.checkLength(cfg)
}

// checkLength refuses a prompt whose tokens and max_tokens exceed the model's context, as vLLM does.
func (r *request) checkLength(cfg *Config) *apiError {
	if total := len(r.tokens) + r.maxTokens; total > cfg.MaxModelLen {
		return badRequest("This model's maximum context length is " + strconv.Itoa(cfg.MaxModelLen) +
			" tokens. However, you requested " + strconv.Itoa(total) + " tokens (" + strconv.Itoa(len(r.tokens)) +
			" in the messages, " + strconv.Itoa(r.maxTokens) + " in the completion). Please reduce the length of the messages or completion.")
	}
	return nil
}

// readMaxTokens sets maxTokens from the first of keys the body sets (at least 1; explicitMax then), else
// the engine's default output length.
func (r *request) readMaxTokens(v *fastjson.Value, cfg *Config, keys ...string) *apiError {
	r.maxTokens = cfg.MaxTokens
	for _, key := range keys {
		mv := v.Get(key)
		if mv == nil || mv.Type() == fastjson.TypeNull {
			continue
		}
		n, err := mv.Int()
		if err != nil || n < 1 {
			return badRequest(key + " must be at least 1, got " + string(mv.MarshalTo(nil)) + ".")
		}
		r.maxTokens = n
		r.explicitMax = true
		break
	}
	return nil
}

// lastWins makes each top-level key of the object v that repeats keep only its last value, as vLLM's
// parse does (FastAPI reads the body with Python's json.loads, whose dict keeps the last value of a key);
// fastjson's Get would find the first. A gateway overrides a client's members by appending its own.
func lastWins(v *fastjson.Value) {
	o, _ := v.Object()
	var keys [64][]byte
	n, dup := 0, false
	o.Visit(func(k []byte, _ *fastjson.Value) {
		for _, prev := range keys[:min(n, len(keys))] {
			if string(prev) == string(k) {
				dup = true
			}
		}
		if n < len(keys) {
			keys[n] = k
		}
		n++
	})
	if !dup && n <= len(keys) {
		return
	}
	last := map[string]*fastjson.Value{}
	o.Visit(func(k []byte, x *fastjson.Value) { last[string(k)] = x })
	for k, x := range last {
		for o.Get(k) != nil {
			o.Del(k)
		}
		o.Set(k, x)
	}
}

// parseObject parses body as a JSON object naming the engine's model, one of its LoRA adapters
// (r.lora then) or none, with p.
func (r *request) parseObject(p *fastjson.Parser, body []byte, cfg *Config) (*fastjson.Value, *apiError) {
	v, err := p.ParseBytes(body)
	if err != nil {
		return nil, badRequest("cannot parse request body as JSON: " + err.Error())
	}
	if v.Type() != fastjson.TypeObject {
		return nil, badRequest("request body must be a JSON object")
	}
	lastWins(v)
	if e := r.checkModel(v, cfg); e != nil {
		return nil, e
	}
	return v, nil
}

// checkModel accepts the base model, a registered LoRA adapter (setting r.lora) or no model.
func (r *request) checkModel(v *fastjson.Value, cfg *Config) *apiError {
	mv := v.Get("model")
	if mv == nil || mv.Type() == fastjson.TypeNull {
		return nil // vLLM serves its only model when none is named
	}
	m, err := mv.StringBytes()
	if err != nil {
		return badRequest("model must be a string")
	}
	if string(m) == cfg.Model {
		return nil
	}
	if cfg.EnableLoRA {
		if r.lora = r.e.lookupLoRA(m); r.lora != nil {
			return nil
		}
	}
	return &apiError{status: 404, typ: "NotFoundError", msg: "The model `" + string(m) + "` does not exist."}
}

// tokenizePrompt handles the completions prompt: a string, token ids, or a list holding one of
// those (the sim serves one prompt per request).
func (r *request) tokenizePrompt(v *fastjson.Value) *apiError {
	pv := v.Get("prompt")
	if pv == nil {
		return badRequest("prompt is required")
	}
	if pv.Type() == fastjson.TypeArray {
		a, _ := pv.Array()
		if len(a) > 0 && (a[0].Type() == fastjson.TypeString || a[0].Type() == fastjson.TypeArray) {
			if len(a) > 1 {
				return badRequest("the sim serves one prompt per request")
			}
			pv = a[0]
		}
	}
	switch pv.Type() {
	case fastjson.TypeString:
		s, _ := pv.StringBytes()
		r.tokens = AppendTokens(r.tokens, s)
	case fastjson.TypeArray:
		a, _ := pv.Array()
		for _, t := range a {
			id, err := t.Uint()
			if err != nil || id > math.MaxUint32 {
				return badRequest("prompt token ids must be non-negative integers")
			}
			r.tokens = append(r.tokens, uint32(id))
		}
	default:
		return badRequest("prompt must be a string, a list of token ids or a list with one of those")
	}
	return nil
}

// tokenizeMessages applies the chat template to messages; the generation prompt is added when
// addGenerationPrompt is true, unless the body sets "add_generation_prompt".
func (r *request) tokenizeMessages(v *fastjson.Value, addGenerationPrompt bool) *apiError {
	mv := v.Get("messages")
	if mv == nil || mv.Type() != fastjson.TypeArray {
		return badRequest("messages must be a list")
	}
	msgs, _ := mv.Array()
	if len(msgs) == 0 {
		return badRequest("messages must not be empty")
	}
	if gv := v.Get("add_generation_prompt"); gv != nil && gv.Type() != fastjson.TypeNull {
		b, err := gv.Bool()
		if err != nil {
			return badRequest("add_generation_prompt must be a boolean")
		}
		addGenerationPrompt = b
	}
	for _, m := range msgs {
		role := m.GetStringBytes("role")
		if len(role) == 0 {
			return badRequest("every message needs a role")
		}
		content, e := r.messageContent(m.Get("content"))
		if e != nil {
			return e
		}
		r.tokens = appendMessageTokens(r.tokens, role, content)
	}
	if addGenerationPrompt {
		r.tokens = appendGenerationPrompt(r.tokens)
	}
	return nil
}

// messageContent returns a message's text: the string, or the text parts joined by "\n" as
// vLLM does for string chat templates. The result is valid until the next call.
func (r *request) messageContent(cv *fastjson.Value) ([]byte, *apiError) {
	if cv == nil {
		return nil, nil
	}
	switch cv.Type() {
	case fastjson.TypeNull:
		return nil, nil
	case fastjson.TypeString:
		s, _ := cv.StringBytes()
		return s, nil
	case fastjson.TypeArray:
		parts, _ := cv.Array()
		r.partsBuf = r.partsBuf[:0]
		n := 0
		for _, p := range parts {
			if !textPart(p.GetStringBytes("type")) {
				continue // images, audio and tool blocks take no tokens in the sim
			}
			if n > 0 {
				r.partsBuf = append(r.partsBuf, '\n')
			}
			r.partsBuf = append(r.partsBuf, p.GetStringBytes("text")...)
			n++
		}
		return r.partsBuf, nil
	}
	return nil, badRequest("message content must be a string or a list of parts")
}

// textPart reports whether a content part of this type holds text: "text" in chat completions and
// Anthropic's messages, "input_text" and "output_text" in the Responses API.
func textPart(typ []byte) bool {
	switch string(typ) {
	case "text", "input_text", "output_text":
		return true
	}
	return false
}

// parseTokenize reads a /tokenize body: {"model", "prompt"} or {"model", "messages",
// "add_generation_prompt" (default true)}.
func (r *request) parseTokenize(body []byte, cfg *Config) *apiError {
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, e := r.parseObject(p, body, cfg)
	if e != nil {
		return e
	}
	if v.Exists("messages") {
		return r.tokenizeMessages(v, true)
	}
	return r.tokenizePrompt(v)
}

// modelJSON returns the "model" of r's answers: the adapter's name for a LoRA request, as
// vLLM's model_name(lora_request) gives, else the base model's. Valid while r is.
func (r *request) modelJSON() []byte {
	if r.lora != nil {
		return r.lora.nameJSON
	}
	return r.e.modelJSON
}

// blocksFor returns the blocks that hold n tokens.
func blocksFor(n, blockSize int) int {
	return (n + blockSize - 1) / blockSize
}
