package loadtest

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/valyala/fastjson"
)

// Response headers the harness reads (docs/routing/README.md, "Decision headers").
const (
	TargetHeader      = "X-Rolter-Target"
	DecisionHeader    = "X-Rolter-Decision"
	PrefixMatchHeader = "X-Rolter-Prefix-Match"
	TokenIDsHeader    = "X-Rolter-Vllm-Token-Ids"
	SessionHeader     = "X-Session-Id"
)

// Reply is what the harness takes from one completion response.
type Reply struct {
	PromptTokens     int
	CachedTokens     int
	CompletionTokens int
	// HasUsage reports whether a usage object was found.
	HasUsage bool
	// Content is the generated text (the stream's deltas joined).
	Content string
	// Events is the number of SSE data events before [DONE] (0 for a JSON reply).
	Events int
}

// Routing is what the gateway said about where a request went.
type Routing struct {
	// Target is x-rolter-target, or "" when absent (no gateway in front).
	Target string
	// Decision is x-rolter-decision, or "".
	Decision string
	// PrefixMatch is x-rolter-prefix-match (the winning prefix-match fraction a cache strategy
	// decided on), or -1 when absent or not a number.
	PrefixMatch float64
}

// ParseRouting reads the routing headers of a response.
func ParseRouting(h http.Header) Routing {
	r := Routing{Target: h.Get(TargetHeader), Decision: h.Get(DecisionHeader), PrefixMatch: -1}
	if v, err := strconv.ParseFloat(h.Get(PrefixMatchHeader), 64); err == nil {
		r.PrefixMatch = v
	}
	return r
}

var errNoDone = errors.New("stream ended without data: [DONE]")

// ParseStream reads an OpenAI SSE body ("data: {...}\n\n" events, "data: [DONE]" last). It
// joins choices[0].delta.content (or choices[0].text for completions), takes the usage object
// of the event that carries one (stream_options.include_usage), and fails on an error event or
// a stream that stops before [DONE].
func ParseStream(body []byte) (Reply, error) {
	var r Reply
	var p fastjson.Parser
	var content []byte
	done := false
	for len(body) > 0 {
		var line []byte
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			line, body = body, nil
		}
		line = bytes.TrimRight(line, "\r")
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue // blank separators, comments (": ping"), event:/id: fields
		}
		data = bytes.TrimLeft(data, " ")
		if string(data) == "[DONE]" {
			done = true
			break
		}
		v, err := p.ParseBytes(data)
		if err != nil {
			return r, fmt.Errorf("cannot parse stream event %q: %w", truncate(data, 80), err)
		}
		if ev := v.Get("error"); ev != nil {
			return r, fmt.Errorf("error event: %s", truncate(ev.GetStringBytes("message"), 200))
		}
		r.Events++
		if ch := v.Get("choices", "0"); ch != nil {
			content = append(content, ch.GetStringBytes("delta", "content")...)
			content = append(content, ch.GetStringBytes("text")...)
		}
		takeUsage(&r, v.Get("usage"))
	}
	r.Content = string(content)
	if !done {
		return r, errNoDone
	}
	return r, nil
}

// ParseJSON reads a non-stream completion body.
func ParseJSON(body []byte) (Reply, error) {
	var r Reply
	var p fastjson.Parser
	v, err := p.ParseBytes(body)
	if err != nil {
		return r, fmt.Errorf("cannot parse response body: %w", err)
	}
	if ev := v.Get("error"); ev != nil {
		return r, fmt.Errorf("error response: %s", truncate(ev.GetStringBytes("message"), 200))
	}
	if ch := v.Get("choices", "0"); ch != nil {
		r.Content = string(ch.GetStringBytes("message", "content")) + string(ch.GetStringBytes("text"))
	}
	takeUsage(&r, v.Get("usage"))
	return r, nil
}

func takeUsage(r *Reply, u *fastjson.Value) {
	if u == nil || u.Type() != fastjson.TypeObject {
		return
	}
	r.HasUsage = true
	r.PromptTokens = u.GetInt("prompt_tokens")
	r.CompletionTokens = u.GetInt("completion_tokens")
	r.CachedTokens = u.GetInt("prompt_tokens_details", "cached_tokens")
}

// errorMessage returns the message of an OpenAI-shaped error body, or the body's start.
func errorMessage(body []byte) string {
	var p fastjson.Parser
	if v, err := p.ParseBytes(body); err == nil {
		if m := v.GetStringBytes("error", "message"); m != nil {
			return string(truncate(m, 200))
		}
	}
	return string(truncate(body, 200))
}

func truncate(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	return b[:n]
}

// FormatTokenIDs renders ids as the x-rolter-vllm-token-ids value: "1,2,3".
func FormatTokenIDs(ids []uint32) string {
	b := make([]byte, 0, len(ids)*6)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(id), 10)
	}
	return string(b)
}
