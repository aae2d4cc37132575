package engine

import (
	"bytes"

	"github.com/rolter-ai/rolter/clientconn"
	"github.com/valyala/fasthttp"
)

// reqHeaders are the values of the request headers the gateway reads, found in the one pass checkRequest
// makes over them; each is the first of its name, as fasthttp's Peek would find it, without a Peek's copy
// and normalisation of the name per lookup.
type reqHeaders struct {
	requestID, sessionID, tokenIDs, authorization, traceparent, connection, expect []byte
	// hop is X-Rolter-Hop, the gateways the request passed through (loop.go).
	hop []byte
}

// add notes header k (a name fasthttp stored in canonical form) if it is one of reqHeaders' and the first.
func (hs *reqHeaders) add(k, v []byte) {
	var dst *[]byte
	switch string(k) {
	case "X-Request-Id":
		dst = &hs.requestID
	case "X-Session-Id":
		dst = &hs.sessionID
	case "X-Rolter-Vllm-Token-Ids":
		dst = &hs.tokenIDs
	case "Authorization":
		dst = &hs.authorization
	case "Traceparent":
		dst = &hs.traceparent
	case "Connection":
		dst = &hs.connection
	case "Expect":
		dst = &hs.expect
	case hopHeader:
		dst = &hs.hop
	default:
		return
	}
	if *dst == nil {
		*dst = v
	}
}

// checkRequest refuses what the HTTP parser let through but the gateway must not forward or serve: a
// protocol version other than HTTP/1.0 and 1.1, header names that are not RFC 9110 tokens (a name with a
// space would reach the engine as some other header), and expectations other than 100-continue. It fills
// hs on the way.
func checkRequest(ctx *fasthttp.RequestCtx, hs *reqHeaders) *apiError {
	h := &ctx.Request.Header
	if p := h.Protocol(); string(p) != "HTTP/1.1" && string(p) != "HTTP/1.0" {
		clientconn.CloseAfter(ctx)
		return &apiError{status: fasthttp.StatusHTTPVersionNotSupported, typ: typeInvalidRequest, code: "http_version_not_supported",
			message: "only HTTP/1.0 and HTTP/1.1 are served", noRetry: true}
	}
	for k, v := range h.All() {
		if !clientconn.IsToken(k) {
			clientconn.CloseAfter(ctx)
			return badRequest("invalid_header", "", "a request header name is not a valid token")
		}
		hs.add(k, v)
	}
	if e := hs.expect; len(e) > 0 && !equalFold(e, "100-continue") {
		clientconn.CloseAfter(ctx)
		return &apiError{status: fasthttp.StatusExpectationFailed, typ: typeInvalidRequest, code: "expectation_failed",
			message: "the only expectation served is 100-continue", noRetry: true}
	}
	return nil
}

// checkContentType accepts JSON bodies (application/json, application/*+json, or no Content-Type, which
// curl-like clients omit) without a content encoding.
func checkContentType(ctx *fasthttp.RequestCtx) *apiError {
	if enc := ctx.Request.Header.ContentEncoding(); len(enc) > 0 && !equalFold(enc, "identity") {
		return &apiError{status: fasthttp.StatusUnsupportedMediaType, typ: typeInvalidRequest, code: "unsupported_media_type",
			message: "request bodies with a Content-Encoding are not supported", noRetry: true}
	}
	ct := ctx.Request.Header.ContentType()
	if len(ct) == 0 {
		return nil
	}
	if i := bytes.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = bytes.TrimSpace(ct)
	if equalFold(ct, "application/json") || (hasPrefixFold(ct, "application/") && len(ct) > 5 && equalFold(ct[len(ct)-5:], "+json")) {
		return nil
	}
	return &apiError{status: fasthttp.StatusUnsupportedMediaType, typ: typeInvalidRequest, code: "unsupported_media_type",
		message: "this Content-Type is not supported; send application/json", noRetry: true}
}

// proxiedPath reports whether a POST to path, which is no endpoint the gateway knows, is proxied as another
// JSON endpoint (promptkey.Other: routed by its body's model, on an empty prompt key): any path under /v1/ but the
// engines' own administration, which no client of the gateway may reach through it - vLLM's runtime LoRA
// loading (/v1/load_lora_adapter and /v1/unload_lora_adapter, with VLLM_ALLOW_RUNTIME_LORA_UPDATING) takes
// a body that has a "model" added. path is the normalised path (fasthttp decodes escapes, removes dot
// segments and repeated slashes), the one sent upstream.
func proxiedPath(path []byte) bool {
	const v1 = "/v1/"
	if len(path) <= len(v1) || string(path[:len(v1)]) != v1 {
		return false
	}
	name := bytes.TrimRight(path[len(v1):], "/")
	return !equalFold(name, "load_lora_adapter") && !equalFold(name, "unload_lora_adapter")
}
