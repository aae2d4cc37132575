package sim

import (
	"strconv"

	"github.com/valyala/fastjson"
)

// OpenAI's Responses API (POST /v1/responses) as vLLM's server answers it: the request's instructions and
// input become chat messages under the same template as /v1/chat/completions (so a conversation's prefix
// is cached across both endpoints), and the answer is a response object with one assistant message item.
// Streamed, it is the API's typed events: response.created, response.output_item.added,
// response.content_part.added, one response.output_text.delta per token, then response.output_text.done,
// response.content_part.done, response.output_item.done and response.completed; no [DONE].

// parseResponses reads a Responses body: model, input (a string, or a list of message items whose content
// is a string or input_text / output_text parts), instructions (a system message first), max_output_tokens
// and stream.
func (r *request) parseResponses(body []byte, cfg *Config) *apiError {
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, e := r.parseObject(p, body, cfg)
	if e != nil {
		return e
	}
	r.api = apiResponses
	r.stream = v.GetBool("stream")
	if e := r.readMaxTokens(v, cfg, "max_output_tokens"); e != nil {
		return e
	}
	if iv := v.Get("instructions"); iv != nil && iv.Type() != fastjson.TypeNull {
		s, err := iv.StringBytes()
		if err != nil {
			return badRequest("instructions must be a string")
		}
		r.tokens = appendMessageTokens(r.tokens, []byte("system"), s)
	}
	in := v.Get("input")
	switch {
	case in == nil:
		return badRequest("input is required")
	case in.Type() == fastjson.TypeString:
		s, _ := in.StringBytes()
		r.tokens = appendMessageTokens(r.tokens, []byte("user"), s)
	case in.Type() == fastjson.TypeArray:
		items, _ := in.Array()
		if len(items) == 0 {
			return badRequest("input must not be empty")
		}
		for _, it := range items {
			if t := it.GetStringBytes("type"); len(t) > 0 && string(t) != "message" {
				continue // function calls and their outputs take no tokens in the sim
			}
			role := it.GetStringBytes("role")
			if len(role) == 0 {
				return badRequest("every input message needs a role")
			}
			content, e := r.messageContent(it.Get("content"))
			if e != nil {
				return e
			}
			r.tokens = appendMessageTokens(r.tokens, role, content)
		}
	default:
		return badRequest("input must be a string or a list of items")
	}
	r.tokens = appendGenerationPrompt(r.tokens)
	return r.checkLength(cfg)
}

// appendResponse appends the response object; done is false for the in-progress object of
// response.created (no output yet, no usage).
func (r *request) appendResponse(dst []byte, done bool) []byte {
	dst = append(dst, `{"id":"`...)
	dst = append(dst, r.id...)
	dst = append(dst, `","object":"response","created_at":`...)
	dst = strconv.AppendInt(dst, r.created, 10)
	dst = append(dst, `,"model":`...)
	dst = append(dst, r.modelJSON()...)
	if !done {
		return append(dst, `,"status":"in_progress","output":[],"usage":null}`...)
	}
	if r.explicitMax {
		dst = append(dst, `,"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}`...)
	} else {
		dst = append(dst, `,"status":"completed","incomplete_details":null`...)
	}
	dst = append(dst, `,"output":[`...)
	dst = r.appendResponseItem(dst, true)
	dst = append(dst, `],"usage":{"input_tokens":`...)
	dst = strconv.AppendInt(dst, int64(len(r.tokens)), 10)
	dst = append(dst, `,"input_tokens_details":{"cached_tokens":`...)
	dst = strconv.AppendInt(dst, int64(r.cachedTokens()), 10)
	dst = append(dst, `},"output_tokens":`...)
	dst = strconv.AppendInt(dst, int64(r.maxTokens), 10)
	dst = append(dst, `,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(len(r.tokens)+r.maxTokens), 10)
	return append(dst, "}}"...)
}

// appendResponseItem appends the assistant message item: complete with its text, or in progress and empty.
func (r *request) appendResponseItem(dst []byte, done bool) []byte {
	dst = append(dst, `{"type":"message","id":"msg_`...)
	dst = append(dst, r.id[len(apiResponses.idPrefix()):]...)
	if !done {
		return append(dst, `","status":"in_progress","role":"assistant","content":[]}`...)
	}
	dst = append(dst, `","status":"completed","role":"assistant","content":[`...)
	dst = r.appendOutputText(dst)
	return append(dst, "]}"...)
}

// appendOutputText appends the output_text content part.
func (r *request) appendOutputText(dst []byte) []byte {
	dst = append(dst, `{"type":"output_text","text":`...)
	dst = r.appendText(dst)
	return append(dst, `,"annotations":[]}`...)
}

// appendResponseEvent appends the start of one typed event, up to its sequence number; the caller appends
// the rest of the object and closes it with eventEnd.
func (r *request) appendResponseEvent(dst []byte, typ string) []byte {
	dst = appendTypedEvent(dst, typ)
	dst = append(dst, `,"sequence_number":`...)
	dst = strconv.AppendInt(dst, int64(r.seq), 10)
	r.seq++
	return append(dst, ',')
}

// appendResponsesOpening appends the events before the first token.
func (r *request) appendResponsesOpening(dst []byte) []byte {
	dst = r.appendResponseEvent(dst, "response.created")
	dst = r.appendResponse(append(dst, `"response":`...), false)
	dst = append(dst, eventEnd...)
	dst = r.appendResponseEvent(dst, "response.output_item.added")
	dst = r.appendResponseItem(append(dst, `"output_index":0,"item":`...), false)
	dst = append(dst, eventEnd...)
	dst = r.appendItemRef(r.appendResponseEvent(dst, "response.content_part.added"))
	return append(dst, `,"part":{"type":"output_text","text":"","annotations":[]}`+eventEnd...)
}

// appendItemRef appends the fields that place a content event: the item, its output and content index.
func (r *request) appendItemRef(dst []byte) []byte {
	dst = append(dst, `"item_id":"msg_`...)
	dst = append(dst, r.id[len(apiResponses.idPrefix()):]...)
	return append(dst, `","output_index":0,"content_index":0`...)
}

// appendResponsesDelta appends the output_text delta of output token i.
func (r *request) appendResponsesDelta(dst []byte, i int) []byte {
	dst = r.appendItemRef(r.appendResponseEvent(dst, "response.output_text.delta"))
	dst = appendJSONString(append(dst, `,"delta":`...), fillerWord(i))
	return append(dst, eventEnd...)
}

// appendResponsesClosing appends the events after the last token, response.completed last.
func (r *request) appendResponsesClosing(dst []byte) []byte {
	dst = r.appendItemRef(r.appendResponseEvent(dst, "response.output_text.done"))
	dst = r.appendText(append(dst, `,"text":`...))
	dst = append(dst, eventEnd...)
	dst = r.appendItemRef(r.appendResponseEvent(dst, "response.content_part.done"))
	dst = r.appendOutputText(append(dst, `,"part":`...))
	dst = append(dst, eventEnd...)
	dst = r.appendResponseEvent(dst, "response.output_item.done")
	dst = r.appendResponseItem(append(dst, `"output_index":0,"item":`...), true)
	dst = append(dst, eventEnd...)
	dst = r.appendResponseEvent(dst, "response.completed")
	dst = r.appendResponse(append(dst, `"response":`...), true)
	return append(dst, eventEnd...)
}
