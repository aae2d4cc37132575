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
func appendErrorBody(dst []byte, e *apiError) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = appendJSONString(dst, e.msg)
	dst = append(dst, `,"type":`...)
	dst = appendJSONString(dst, e.typ)
	dst = append(dst, `,"param":null,"code":`...)
	dst = strconv.AppendInt(dst, int64(e.status), 10)
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
	return append(dst, r.e.modelJSON...)
}

func (r *request) cachedTokens() int { return r.hit * r.e.cfg.BlockSize }

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
	if r.chat {
		dst = r.appendHead(dst, "chat.completion")
		dst = append(dst, `,"choices":[{"index":0,"message":{"role":"assistant","content":`...)
		dst = r.appendText(dst)
		dst = append(dst, `,"tool_calls":[]},"logprobs":null,"finish_reason":`...)
		dst = append(dst, r.finishReason()...)
		dst = append(dst, `,"stop_reason":null}],`...)
		dst = r.appendUsage(dst)
		return append(dst, `,"prompt_logprobs":null}`...)
	}
	dst = r.appendHead(dst, "text_completion")
	dst = append(dst, `,"choices":[{"index":0,"text":`...)
	dst = r.appendText(dst)
	dst = append(dst, `,"logprobs":null,"finish_reason":`...)
	dst = append(dst, r.finishReason()...)
	dst = append(dst, `,"stop_reason":null,"prompt_logprobs":null}],`...)
	dst = r.appendUsage(dst)
	return append(dst, '}')
}

// appendRoleEvent appends the first chat stream event, the assistant role.
func (r *request) appendRoleEvent(dst []byte) []byte {
	dst = append(dst, "data: "...)
	dst = r.appendHead(dst, "chat.completion.chunk")
	dst = append(dst, `,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`...)
	return append(dst, "\n\n"...)
}

// appendTokenEvent appends the stream event of output token i.
func (r *request) appendTokenEvent(dst []byte, i int) []byte {
	last := i == r.maxTokens-1
	dst = append(dst, "data: "...)
	if r.chat {
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
	if r.chat {
		dst = r.appendHead(dst, "chat.completion.chunk")
	} else {
		dst = r.appendHead(dst, "text_completion")
	}
	dst = append(dst, `,"choices":[],`...)
	dst = r.appendUsage(dst)
	return append(dst, "}\n\n"...)
}

const doneEvent = "data: [DONE]\n\n"
