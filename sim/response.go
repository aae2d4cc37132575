package sim

import (
	"strconv"
	"unicode/utf8"
)

// Response bodies in vLLM's OpenAI server shapes (vllm/entrypoints/openai/protocol.py), built
// by appending into the request's buffer.

// appendJSONString appends s as a JSON string.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); {
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
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		case c < utf8.RuneSelf:
			dst = append(dst, c)
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, `\ufffd`...)
			} else {
				dst = append(dst, s[i:i+size]...)
			}
			i += size
			continue
		}
		i++
	}
	return append(dst, '"')
}

const hexDigits = "0123456789abcdef"

// appendErrorBody appends {"error":{"message","type","param":null,"code"}}.
// A request that spoke SGLang's protocol gets SGLang's shape instead.
func appendErrorBody(dst []byte, e *apiError) []byte {
	if e.sglang {
		return appendSGLangError(dst, e)
	}
	dst = append(dst, `{"error":{"message":`...)
	dst = appendJSONString(dst, e.msg)
	dst = append(dst, `,"type":`...)
	dst = appendJSONString(dst, e.typ)
	dst = append(dst, `,"param":null,"code":`...)
	dst = strconv.AppendInt(dst, int64(e.status), 10)
	return append(dst, "}}"...)
}

// appendAnthropicError appends Anthropic's error shape, {"type":"error","error":{"type","message"}}, with
// the error type Anthropic's API gives the status.
func appendAnthropicError(dst []byte, e *apiError) []byte {
	typ := "api_error"
	switch e.status {
	case 400:
		typ = "invalid_request_error"
	case 404:
		typ = "not_found_error"
	case 429:
		typ = "rate_limit_error"
	case 503:
		typ = "overloaded_error"
	}
	dst = append(dst, `{"type":"error","error":{"type":"`...)
	dst = append(dst, typ...)
	dst = append(dst, `","message":`...)
	dst = appendJSONString(dst, e.msg)
	return append(dst, "}}"...)
}

// appendHead appends the fields every response object starts with.
func (r *request) appendHead(dst []byte, object string) []byte {
	dst = append(dst, `{"id":"`...)
	dst = append(dst, r.id...)
	dst = append(dst, `","object":"`...)
	dst = append(dst, object...)
	dst = append(dst, `","created":`...)
	dst = strconv.AppendInt(dst, r.created, 10)
	dst = append(dst, `,"model":`...)
	return append(dst, r.modelJSON()...)
}

// cachedTokens is usage's cached_tokens: the prompt tokens not computed here, except on an SGLang
// decode engine, which reports the prefill engine's figure (decode.py _commit_transfer_to_req
// copies it from the transferred metadata).
func (r *request) cachedTokens() int {
	if r.reportCached >= 0 {
		return r.reportCached
	}
	return r.cached
}

func (r *request) appendUsage(dst []byte) []byte {
	dst = append(dst, `"usage":{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(len(r.tokens)), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(len(r.tokens)+r.maxTokens), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(r.maxTokens), 10)
	dst = append(dst, `,"prompt_tokens_details":{"cached_tokens":`...)
	dst = strconv.AppendInt(dst, int64(r.cachedTokens()), 10)
	return append(dst, "}}"...)
}

func (r *request) finishReason() string {
	if r.explicitMax {
		return `"length"`
	}
	return `"stop"`
}

// appendText appends the generated text, JSON-quoted.
func (r *request) appendText(dst []byte) []byte {
	dst = append(dst, '"')
	for i := 0; i < r.maxTokens; i++ {
		dst = append(dst, fillerWord(i)...)
	}
	return append(dst, '"')
}

// appendFull appends the non-stream response.
func (r *request) appendFull(dst []byte) []byte {
	switch r.api {
	case apiResponses:
		return r.appendResponse(dst, true)
	case apiMessages:
		return r.appendMessage(dst, true)
	}
	if r.api == apiChat {
		dst = r.appendHead(dst, "chat.completion")
		dst = append(dst, `,"choices":[{"index":0,"message":{"role":"assistant","content":`...)
		dst = r.appendText(dst)
		dst = append(dst, `,"tool_calls":[]},"logprobs":null,"finish_reason":`...)
		dst = append(dst, r.finishReason()...)
		dst = append(dst, `,"stop_reason":null}],`...)
		dst = r.appendUsage(dst)
		dst = append(dst, `,"prompt_logprobs":null`...)
		return r.appendKVTail(dst)
	}
	dst = r.appendHead(dst, "text_completion")
	dst = append(dst, `,"choices":[{"index":0,"text":`...)
	dst = r.appendText(dst)
	dst = append(dst, `,"logprobs":null,"finish_reason":`...)
	dst = append(dst, r.finishReason()...)
	dst = append(dst, `,"stop_reason":null,"prompt_logprobs":null}],`...)
	dst = r.appendUsage(dst)
	return r.appendKVTail(dst)
}

// appendKVTail ends a chat or completions body; a prefill engine's answer to a
// do_remote_decode request carries kv_transfer_params, as vLLM's response does.
func (r *request) appendKVTail(dst []byte) []byte {
	if r.offerKey != "" {
		dst = append(dst, ',')
		dst = r.appendOffer(dst)
	}
	return append(dst, '}')
}

// appendRoleEvent appends the first chat stream event, the assistant role.
func (r *request) appendRoleEvent(dst []byte) []byte {
	dst = append(dst, "data: "...)
	dst = r.appendHead(dst, "chat.completion.chunk")
	dst = append(dst, `,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`...)
	return append(dst, "\n\n"...)
}

// appendOpening appends the stream events before the first token: the chat role event, the Responses
// and Messages APIs' opening events, nothing for completions.
func (r *request) appendOpening(dst []byte) []byte {
	switch r.api {
	case apiChat:
		return r.appendRoleEvent(dst)
	case apiResponses:
		return r.appendResponsesOpening(dst)
	case apiMessages:
		return r.appendMessagesOpening(dst)
	}
	return dst
}

// appendClosing appends the stream events after the last token: the include_usage event of chat and
// completions (when asked for), the Responses and Messages APIs' closing events.
func (r *request) appendClosing(dst []byte) []byte {
	switch r.api {
	case apiResponses:
		return r.appendResponsesClosing(dst)
	case apiMessages:
		return r.appendMessagesClosing(dst)
	}
	if r.includeUsage {
		return r.appendUsageEvent(dst)
	}
	return dst
}

// appendTokenEvent appends the stream event of output token i.
func (r *request) appendTokenEvent(dst []byte, i int) []byte {
	switch r.api {
	case apiResponses:
		return r.appendResponsesDelta(dst, i)
	case apiMessages:
		return r.appendMessagesDelta(dst, i)
	}
	last := i == r.maxTokens-1
	dst = append(dst, "data: "...)
	if r.api == apiChat {
		dst = r.appendHead(dst, "chat.completion.chunk")
		dst = append(dst, `,"choices":[{"index":0,"delta":{"content":`...)
		dst = appendJSONString(dst, fillerWord(i))
		dst = append(dst, `},"logprobs":null,"finish_reason":`...)
	} else {
		dst = r.appendHead(dst, "text_completion")
		dst = append(dst, `,"choices":[{"index":0,"text":`...)
		dst = appendJSONString(dst, fillerWord(i))
		dst = append(dst, `,"logprobs":null,"finish_reason":`...)
	}
	if last {
		dst = append(dst, r.finishReason()...)
	} else {
		dst = append(dst, "null"...)
	}
	return append(dst, `,"stop_reason":null}]}`+"\n\n"...)
}

// appendUsageEvent appends the stream_options.include_usage event: no choices, only usage.
func (r *request) appendUsageEvent(dst []byte) []byte {
	dst = append(dst, "data: "...)
	if r.api == apiChat {
		dst = r.appendHead(dst, "chat.completion.chunk")
	} else {
		dst = r.appendHead(dst, "text_completion")
	}
	dst = append(dst, `,"choices":[],`...)
	dst = r.appendUsage(dst)
	return append(dst, "}\n\n"...)
}

const doneEvent = "data: [DONE]\n\n"

// appendTypedEvent appends the start of a typed SSE event, as the Responses and Messages APIs stream them:
// its name, and a data object that opens with the same type; the caller appends the rest of the object
// and eventEnd.
func appendTypedEvent(dst []byte, typ string) []byte {
	dst = append(dst, "event: "...)
	dst = append(dst, typ...)
	dst = append(dst, "\ndata: {\"type\":\""...)
	dst = append(dst, typ...)
	return append(dst, '"')
}

// eventEnd closes a typed event's data object and the event.
const eventEnd = "}\n\n"

// appendDone appends the end of a chat or completions stream, [DONE]; the Responses and Messages APIs end
// with their last typed event.
func (r *request) appendDone(dst []byte) []byte {
	if r.api == apiChat || r.api == apiCompletions {
		return append(dst, doneEvent...)
	}
	return dst
}
