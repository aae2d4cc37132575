package sim

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// POST /v1/embeddings as vLLM's server answers it for an embedding model: one vector per input (a string,
// a list of strings, token ids, or a list of token-id lists), L2-normalised, as floats or as base64 of
// little-endian float32 (encoding_format), with usage.prompt_tokens. The vector is a deterministic
// function of the input's tokens, so equal inputs embed equally; it takes the latency model's prefill time
// for its tokens and no KV cache (pooling runs no decode and keeps no prefix).

// embeddingDims is the length of a vector when the request does not set dimensions.
const embeddingDims = 64

func (e *Engine) serveEmbeddings(ctx *fasthttp.RequestCtx) {
	e.requests.Add(1)
	if e.stopped() {
		ctx.SetConnectionClose()
		writeError(ctx, errStopping)
		return
	}
	r := e.getRequest()
	defer e.putRequest(r)
	if ae := r.parseEmbeddings(ctx.PostBody(), &e.cfg); ae != nil {
		writeError(ctx, ae)
		return
	}
	r.conn = ctx.Conn()
	if !e.pause(r, time.Duration(len(r.tokens))*e.cfg.PrefillPerToken) {
		ctx.SetConnectionClose()
		return
	}
	e.newID(r, "embd-", nil)
	r.created = time.Now().Unix()
	r.out = r.appendEmbeddings(r.out[:0])
	ctx.SetContentType("application/json")
	ctx.SetBody(r.out)
}

// parseEmbeddings reads an embeddings body: every input's tokens into r.tokens (r.inputEnds marks where
// each ends), the vector length and the encoding.
func (r *request) parseEmbeddings(body []byte, cfg *Config) *apiError {
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, ae := r.parseObject(p, body, cfg)
	if ae != nil {
		return ae
	}
	switch f := string(v.GetStringBytes("encoding_format")); f {
	case "", "float":
	case "base64":
		r.base64 = true
	default:
		return badRequest(`encoding_format must be "float" or "base64"`)
	}
	r.dims = embeddingDims
	if dv := v.Get("dimensions"); dv != nil && dv.Type() != fastjson.TypeNull {
		n, err := dv.Int()
		if err != nil || n < 1 || n > 4096 {
			return badRequest("dimensions must be between 1 and 4096")
		}
		r.dims = n
	}
	in := v.Get("input")
	if in == nil {
		return badRequest("input is required")
	}
	inputs := []*fastjson.Value{in}
	if a, _ := in.Array(); in.Type() == fastjson.TypeArray && (len(a) == 0 || a[0].Type() != fastjson.TypeNumber) {
		inputs = a // a list of inputs, not one input of token ids
	}
	if len(inputs) == 0 {
		return badRequest("input must not be empty")
	}
	for _, in := range inputs {
		start := len(r.tokens)
		if r.tokens, ae = appendInputTokens(r.tokens, in); ae != nil {
			return ae
		}
		if len(r.tokens)-start > cfg.MaxModelLen {
			return badRequest("This model's maximum context length is " + strconv.Itoa(cfg.MaxModelLen) +
				" tokens. However, an input has " + strconv.Itoa(len(r.tokens)-start) + " tokens.")
		}
		r.inputEnds = append(r.inputEnds, len(r.tokens))
	}
	return nil
}

// appendInputTokens appends the tokens of one input: a string or a list of token ids.
func appendInputTokens(dst []uint32, in *fastjson.Value) ([]uint32, *apiError) {
	switch in.Type() {
	case fastjson.TypeString:
		s, _ := in.StringBytes()
		if len(s) == 0 {
			return dst, badRequest("input must not be an empty string")
		}
		return AppendTokens(dst, s), nil
	case fastjson.TypeArray:
		a, _ := in.Array()
		if len(a) == 0 {
			return dst, badRequest("input token lists must not be empty")
		}
		for _, t := range a {
			id, err := t.Uint()
			if err != nil || id > math.MaxUint32 {
				return dst, badRequest("input token ids must be non-negative integers")
			}
			dst = append(dst, uint32(id))
		}
		return dst, nil
	}
	return dst, badRequest("input must be a string, a list of strings, token ids or a list of token-id lists")
}

// appendEmbeddings appends the answer: a list of one embedding per input, then usage.
func (r *request) appendEmbeddings(dst []byte) []byte {
	dst = append(dst, `{"id":"`...)
	dst = append(dst, r.id...)
	dst = append(dst, `","object":"list","created":`...)
	dst = strconv.AppendInt(dst, r.created, 10)
	dst = append(dst, `,"model":`...)
	dst = append(dst, r.modelJSON()...)
	dst = append(dst, `,"data":[`...)
	start := 0
	for i, end := range r.inputEnds {
		r.vec = embed(r.vec[:0], r.dims, r.tokens[start:end])
		start = end
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"index":`...)
		dst = strconv.AppendInt(dst, int64(i), 10)
		dst = append(dst, `,"object":"embedding","embedding":`...)
		dst = r.appendVector(dst)
		dst = append(dst, '}')
	}
	dst = append(dst, `],"usage":{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(len(r.tokens)), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(len(r.tokens)), 10)
	return append(dst, `,"completion_tokens":0,"prompt_tokens_details":null}}`...)
}

// embed appends the unit vector of tokens, dims long, to vec: each token adds a pseudo-random direction
// of its own.
func embed(vec []float64, dims int, tokens []uint32) []float64 {
	for range dims {
		vec = append(vec, 0)
	}
	for _, t := range tokens {
		for k := range vec {
			x := splitmix(uint64(t)<<32 | uint64(k))
			vec[k] += float64(int64(x>>11))/float64(1<<52) - 1
		}
	}
	var norm float64
	for _, x := range vec {
		norm += x * x
	}
	if norm = math.Sqrt(norm); norm > 0 {
		for k := range vec {
			vec[k] /= norm
		}
	}
	return vec
}

// splitmix is SplitMix64's output function: a well-mixed 64-bit value of x.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// appendVector appends r.vec as float32s: a JSON list, or with base64 a string of their little-endian bytes
// (built in r.partsBuf).
func (r *request) appendVector(dst []byte) []byte {
	if r.base64 {
		raw := r.partsBuf[:0]
		for _, x := range r.vec {
			raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(float32(x)))
		}
		r.partsBuf = raw
		dst = append(dst, '"')
		dst = base64.StdEncoding.AppendEncode(dst, raw)
		return append(dst, '"')
	}
	dst = append(dst, '[')
	for i, x := range r.vec {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendFloat(dst, float64(float32(x)), 'g', -1, 32)
	}
	return append(dst, ']')
}
