package sim

import (
	"strconv"

	"github.com/valyala/fastjson"
)

// Anthropic's Messages API (POST /v1/messages) as vLLM's server answers it: system and messages become chat
// messages under the same template as /v1/chat/completions, and the answer is a message with one text
// block. max_tokens is required and caps the output: the engine writes min(max_tokens, its default output
// length) tokens, stop_reason "max_tokens" when the cap cut it, "end_turn" otherwise. usage reports
// input_tokens, output_tokens and cache_read_input_tokens (the prompt's cached tokens). Streamed, it is
// Anthropic's events: message_start, content_block_start, one content_block_delta per token,
// content_block_stop, message_delta (stop reason and output tokens) and message_stop; no [DONE].

// parseMessages reads a Messages body: model, max_tokens, system (a string or text blocks), messages
// (content a string or blocks, of which text blocks count) and stream.
func (r *request) parseMessages(body []byte, cfg *Config) *apiError {
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, e := r.parseObject(p, body, cfg)
	if e != nil {
		return e
	}
	r.api = apiMessages
	r.stream = v.GetBool("stream")
	mv := v.Get("max_tokens")
	if mv == nil || mv.Type() == fastjson.TypeNull {
		return badRequest("max_tokens is required")
	}
	n, err := mv.Int()
	if err != nil || n < 1 {
		return badRequest("max_tokens must be at least 1, got " + string(mv.MarshalTo(nil)) + ".")
	}
	r.maxTokens, r.explicitMax = min(n, cfg.MaxTokens), n <= cfg.MaxTokens
	if sv := v.Get("system"); sv != nil && sv.Type() != fastjson.TypeNull {
		s, e := r.messageContent(sv)
		if e != nil {
			return badRequest("system must be a string or a list of text blocks")
		}
		r.tokens = appendMessageTokens(r.tokens, []byte("system"), s)
	}
	if e := r.tokenizeMessages(v, true); e != nil {
		return e
	}
	return r.checkLength(cfg)
}

// stopReason is the message's stop_reason, JSON-quoted.
func (r *request) stopReason() string {
	if r.explicitMax {
		return `"max_tokens"`
	}
	return `"end_turn"`
}

// appendMessage appends the message object; done is false for message_start's (no content yet, no
// output tokens).
func (r *request) appendMessage(dst []byte, done bool) []byte {
	dst = append(dst, `{"id":"`...)
	dst = append(dst, r.id...)
	dst = append(dst, `","type":"message","role":"assistant","model":`...)
	dst = append(dst, r.modelJSON()...)
	if done {
		dst = append(dst, `,"content":[{"type":"text","text":`...)
		dst = r.appendText(dst)
		dst = append(dst, `}],"stop_reason":`...)
		dst = append(dst, r.stopReason()...)
	} else {
		dst = append(dst, `,"content":[],"stop_reason":null`...)
	}
	dst = append(dst, `,"stop_sequence":null,"usage":{"input_tokens":`...)
	dst = strconv.AppendInt(dst, int64(len(r.tokens)), 10)
	dst = append(dst, `,"output_tokens":`...)
	if done {
		dst = strconv.AppendInt(dst, int64(r.maxTokens), 10)
	} else {
		dst = append(dst, '0')
	}
	dst = append(dst, `,"cache_read_input_tokens":`...)
	dst = strconv.AppendInt(dst, int64(r.cachedTokens()), 10)
	return append(dst, "}}"...)
}

// appendMessagesOpening appends message_start and content_block_start.
func (r *request) appendMessagesOpening(dst []byte) []byte {
	dst = appendTypedEvent(dst, "message_start")
	dst = r.appendMessage(append(dst, `,"message":`...), false)
	dst = append(dst, eventEnd...)
	dst = appendTypedEvent(dst, "content_block_start")
	return append(dst, `,"index":0,"content_block":{"type":"text","text":""}}`+"\n\n"...)
}

// appendMessagesDelta appends the text delta of output token i.
func (r *request) appendMessagesDelta(dst []byte, i int) []byte {
	dst = appendTypedEvent(dst, "content_block_delta")
	dst = append(dst, `,"index":0,"delta":{"type":"text_delta","text":`...)
	dst = appendJSONString(dst, fillerWord(i))
	return append(dst, "}}\n\n"...)
}

// appendMessagesClosing appends content_block_stop, message_delta and message_stop.
func (r *request) appendMessagesClosing(dst []byte) []byte {
	dst = appendTypedEvent(dst, "content_block_stop")
	dst = append(dst, `,"index":0}`+"\n\n"...)
	dst = appendTypedEvent(dst, "message_delta")
	dst = append(dst, `,"delta":{"stop_reason":`...)
	dst = append(dst, r.stopReason()...)
	dst = append(dst, `,"stop_sequence":null},"usage":{"output_tokens":`...)
	dst = strconv.AppendInt(dst, int64(r.maxTokens), 10)
	dst = append(dst, "}}\n\n"...)
	dst = appendTypedEvent(dst, "message_stop")
	return append(dst, eventEnd...)
}
