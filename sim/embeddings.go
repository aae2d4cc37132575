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
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, ae := parseObject(p, ctx.PostBody(), &e.cfg)
	if ae == nil {
		ae = r.parseEmbeddings(v, &e.cfg)
	}
	if ae != nil {
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
	ctx.SetContentType("application/json")
	ctx.SetBody(r.appendEmbeddings(r.out[:0], v))
}

// parseEmbeddings checks an embeddings body and tokenizes all its inputs into r.tokens (for usage and the
// prefill time); the vectors are computed per input when the answer is written.
func (r *request) parseEmbeddings(v *fastjson.Value, cfg *Config) *apiError {
	inputs, ae := embeddingInputs(v)
	if ae != nil {
		return ae
	}
	if f := string(v.GetStringBytes("encoding_format")); f != "" && f != "float" && f != "base64" {
		return badRequest(`encoding_format must be "float" or "base64"`)
	}
	if dv := v.Get("dimensions"); dv != nil && dv.Type() != fastjson.TypeNull {
		if n, err := dv.Int(); err != nil || n < 1 || n > 4096 {
			return badRequest("dimensions must be between 1 and 4096")
		}
	}
	for _, in := range inputs {
		var ae *apiError
		if r.tokens, ae = appendInputTokens(r.tokens, in); ae != nil {
			return ae
		}
	}
	if len(r.tokens) > cfg.MaxModelLen*len(inputs) {
		return badRequest("This model's maximum context length is " + strconv.Itoa(cfg.MaxModelLen) + " tokens.")
	}
	return nil
}

// embeddingInputs returns the inputs of an embeddings body: one per string or token-id list.
func embeddingInputs(v *fastjson.Value) ([]*fastjson.Value, *apiError) {
	in := v.Get("input")
	if in == nil {
		return nil, badRequest("input is required")
	}
	if in.Type() != fastjson.TypeArray {
		return []*fastjson.Value{in}, nil
	}
	a, _ := in.Array()
	if len(a) == 0 {
		return nil, badRequest("input must not be empty")
	}
	if a[0].Type() == fastjson.TypeNumber {
		return []*fastjson.Value{in}, nil // one input of token ids
	}
	return a, nil
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
func (r *request) appendEmbeddings(dst []byte, v *fastjson.Value) []byte {
	inputs, _ := embeddingInputs(v)
	dims := embeddingDims
	if n := v.GetInt("dimensions"); n > 0 {
		dims = n
	}
	base64Format := string(v.GetStringBytes("encoding_format")) == "base64"
	dst = append(dst, `{"id":"`...)
	dst = append(dst, r.id...)
	dst = append(dst, `","object":"list","created":`...)
	dst = strconv.AppendInt(dst, r.created, 10)
	dst = append(dst, `,"model":`...)
	dst = append(dst, r.e.modelJSON...)
	dst = append(dst, `,"data":[`...)
	vec := make([]float32, dims)
	var toks []uint32
	for i, in := range inputs {
		toks, _ = appendInputTokens(toks[:0], in)
		embed(vec, toks)
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"index":`...)
		dst = strconv.AppendInt(dst, int64(i), 10)
		dst = append(dst, `,"object":"embedding","embedding":`...)
		dst = appendVector(dst, vec, base64Format)
		dst = append(dst, '}')
	}
	dst = append(dst, `],"usage":{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(len(r.tokens)), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(len(r.tokens)), 10)
	return append(dst, `,"completion_tokens":0,"prompt_tokens_details":null}}`...)
}

// embed writes the unit vector of tokens into vec: each token adds a pseudo-random direction of its own.
func embed(vec []float32, tokens []uint32) {
	sum := make([]float64, len(vec))
	for _, t := range tokens {
		for k := range sum {
			x := splitmix(uint64(t)<<32 | uint64(k))
			sum[k] += float64(int64(x>>11))/float64(1<<52) - 1
		}
	}
	var norm float64
	for _, x := range sum {
		norm += x * x
	}
	norm = math.Sqrt(norm)
	for k, x := range sum {
		if norm > 0 {
			x /= norm
		}
		vec[k] = float32(x)
	}
}

// splitmix is SplitMix64's output function: a well-mixed 64-bit value of x.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// appendVector appends vec as a JSON list of floats, or as a base64 string of little-endian float32.
func appendVector(dst []byte, vec []float32, base64Format bool) []byte {
	if base64Format {
		raw := make([]byte, 4*len(vec))
		for i, x := range vec {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(x))
		}
		dst = append(dst, '"')
		dst = base64.StdEncoding.AppendEncode(dst, raw)
		return append(dst, '"')
	}
	dst = append(dst, '[')
	for i, x := range vec {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendFloat(dst, float64(x), 'g', -1, 32)
	}
	return append(dst, ']')
}
