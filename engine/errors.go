package engine

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/rolter-ai/rolter/promptkey"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// apiError is an error answered to a client in OpenAI's shape:
// {"error":{"message":...,"type":...,"param":...,"code":"..."}} with a string code
// (docs/configuration/reliability.md; OpenAI's shape: developers.openai.com/docs/guides/error-codes).
type apiError struct {
	status  int
	typ     string
	code    string
	message string
	param   string
	// retryAfter, when > 0, is sent as retry-after (seconds) and retry-after-ms.
	retryAfterMs int
	// noRetry sends x-should-retry: false, telling the OpenAI SDKs that retrying is pointless.
	noRetry bool
}

const (
	typeInvalidRequest = "invalid_request_error"
	typeServer         = "server_error"
	typeRateLimit      = "rate_limit_error"
	typeAuth           = "authentication_error"
	typeTimeout        = "timeout_error"
)

func badRequest(code, param, msg string) *apiError {
	return &apiError{status: fasthttp.StatusBadRequest, typ: typeInvalidRequest, code: code, param: param, message: msg, noRetry: true}
}

// scanError is the answer to a body the scanner refuses: 400, with the scanner's code, param and message.
func scanError(e *promptkey.Error) *apiError {
	return badRequest(e.Code, e.Param, e.Message)
}

// appendBody appends the JSON body of e.
func (e *apiError) appendBody(dst []byte) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = appendJSONString(dst, e.message)
	dst = append(dst, `,"type":`...)
	dst = appendJSONString(dst, e.typ)
	dst = append(dst, `,"param":`...)
	if e.param == "" {
		dst = append(dst, "null"...)
	} else {
		dst = appendJSONString(dst, e.param)
	}
	dst = append(dst, `,"code":`...)
	dst = appendJSONString(dst, e.code)
	return append(dst, "}}"...)
}

// writeError answers e to the client; every error answer the gateway gives is written here, whether the
// request was refused before routing or failed after it. It sets the status, the OpenAI-shaped body,
// Retry-After and Retry-After-Ms when e has a wait, X-Should-Retry: false when retrying is pointless, and
// the headers of every answer (answerHeaders: X-Request-Id, and the decision headers once routed). The
// response must not have a body stream yet. The request then ends with finish(c.status).
func (c *call) writeError(ctx *fasthttp.RequestCtx, e *apiError) {
	r := &ctx.Response
	r.ResetBody()
	r.SetStatusCode(e.status)
	r.Header.SetContentType("application/json")
	if e.retryAfterMs > 0 {
		var num [20]byte
		r.Header.SetCanonical(hdrRetryAfter, strconv.AppendInt(num[:0], int64((e.retryAfterMs+999)/1000), 10))
		r.Header.SetCanonical(hdrRetryAfterMs, strconv.AppendInt(num[:0], int64(e.retryAfterMs), 10))
	}
	if e.noRetry {
		r.Header.SetCanonical(hdrShouldRetry, valueFalse)
	}
	// The body is copied into the response, so the call's buffer is free again when the call is released.
	c.errBuf = e.appendBody(c.errBuf[:0])
	r.SetBody(c.errBuf)
	c.answerHeaders(ctx)
	c.status, c.errCode = e.status, e.code
}

// Header names of error answers, in canonical form.
var (
	hdrRetryAfter   = []byte("Retry-After")
	hdrRetryAfterMs = []byte("Retry-After-Ms")
	hdrShouldRetry  = []byte("X-Should-Retry")
	valueFalse      = []byte("false")
)

// normaliseUpstreamError turns an upstream error body into an apiError with the upstream's status.
// Accepted shapes: OpenAI/new vLLM {"error":{"message","type","param","code":int|string}}, old vLLM
// {"object":"error","message","type","param","code":int}, FastAPI {"detail": "..." | [...]}.
//
// The message of a 4xx (and 429) answer in one of those shapes is the engine telling the client what was
// wrong with its request ("maximum context length is 8192 tokens"), so it is passed on. Nothing else of the
// upstream's body reaches the client - not a 5xx message (stack traces, internal addresses) and not a body
// that is not an error object (an HTML page from a proxy in front of the engine): the client gets a message
// naming the status, and the body is for the logs.
func normaliseUpstreamError(status int, body []byte) *apiError {
	e := &apiError{status: status, typ: typeForStatus(status), code: codeForStatus(status)}
	if status >= 500 {
		e.message = "the upstream failed with HTTP " + strconv.Itoa(status)
		return e
	}
	var p fastjson.Parser
	v, err := p.ParseBytes(body)
	if err == nil && v.Type() == fastjson.TypeObject {
		obj := v
		if inner := v.Get("error"); inner != nil && inner.Type() == fastjson.TypeObject {
			obj = inner
		} else if inner != nil && inner.Type() == fastjson.TypeString {
			e.message = string(inner.GetStringBytes())
		}
		if m := obj.Get("message"); m != nil && m.Type() == fastjson.TypeString {
			e.message = string(m.GetStringBytes())
		}
		if d := obj.Get("detail"); d != nil && e.message == "" {
			if d.Type() == fastjson.TypeString {
				e.message = string(d.GetStringBytes())
			} else {
				e.message = string(d.MarshalTo(nil))
			}
		}
		if t := obj.Get("type"); t != nil && t.Type() == fastjson.TypeString && len(t.GetStringBytes()) > 0 {
			e.typ = upstreamType(string(t.GetStringBytes()), status)
		}
		if pv := obj.Get("param"); pv != nil && pv.Type() == fastjson.TypeString {
			e.param = string(pv.GetStringBytes())
		}
		if c := obj.Get("code"); c != nil && c.Type() == fastjson.TypeString && len(c.GetStringBytes()) > 0 {
			e.code = string(c.GetStringBytes())
		}
	}
	e.message = strings.TrimSpace(sanitiseText([]byte(e.message)))
	if e.message == "" {
		e.message = "the upstream answered HTTP " + strconv.Itoa(status)
	}
	return e
}

// upstreamType keeps OpenAI's own types and maps vLLM's exception class names (NotFoundError, BadRequestError...)
// to OpenAI's coarse types, which is what SDKs and users expect.
func upstreamType(t string, status int) string {
	switch t {
	case typeInvalidRequest, typeServer, typeRateLimit, typeAuth, "insufficient_quota", "permission_error", "not_found_error":
		return t
	}
	return typeForStatus(status)
}

func typeForStatus(status int) string {
	switch {
	case status == 401 || status == 403:
		return typeAuth
	case status == 429:
		return typeRateLimit
	case status == 504 || status == 408:
		return typeTimeout
	case status >= 500:
		return typeServer
	default:
		return typeInvalidRequest
	}
}

func codeForStatus(status int) string {
	switch status {
	case 400:
		return "bad_request"
	case 401:
		return "invalid_api_key"
	case 403:
		return "forbidden"
	case 404:
		return "not_found"
	case 405:
		return "method_not_allowed"
	case 408:
		return "request_timeout"
	case 409:
		return "conflict"
	case 413:
		return "request_too_large"
	case 415:
		return "unsupported_media_type"
	case 422:
		return "unprocessable_entity"
	case 429:
		return "rate_limit_exceeded"
	case 502:
		return "upstream_error"
	case 503:
		return "service_unavailable"
	case 504:
		return "upstream_timeout"
	}
	if status >= 500 {
		return "upstream_error"
	}
	return "error_" + strconv.Itoa(status)
}

// sanitiseText returns b as valid UTF-8, capped, for use in an error message.
func sanitiseText(b []byte) string {
	if len(b) > 4096 {
		b = b[:4096]
	}
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// appendJSONString appends s as a JSON string literal.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c == '\n':
			dst = append(dst, '\\', 'n')
		case c == '\r':
			dst = append(dst, '\\', 'r')
		case c == '\t':
			dst = append(dst, '\\', 't')
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		case c < utf8.RuneSelf:
			dst = append(dst, c)
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, `\ufffd`...)
				continue
			}
			dst = append(dst, s[i:i+size]...)
			i += size - 1
		}
	}
	return append(dst, '"')
}
