package engine

import (
	"strconv"
	"unicode/utf8"

	"github.com/valyala/fastjson"
)

// endpoint is a data-plane API.
type endpoint uint8

const (
	epChat endpoint = iota
	epCompletions
	epEmbeddings
	numEndpoints
)

var endpointPaths = [numEndpoints]string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings"}

// Prompt key separators (../shared/DESIGN.md "Prompt key"): the role and the text of a message are split by
// keyRoleSep and every message ends with keyMsgEnd, so "user: a" + "b" and "user: ab" differ, and roles
// cannot be confused with text. Both are ASCII control characters that JSON text would have to escape.
const (
	keyRoleSep = 0x1f // unit separator
	keyMsgEnd  = 0x1e // record separator
)

// appendPromptKey appends the prompt key of the request body v to dst and returns it.
//
// The key is the conversation itself, not the JSON: for chat, each message's role, keyRoleSep, its text (a
// string content, or the "text" parts of an array content in order) and keyMsgEnd; for completions the
// prompt string (or each string of a prompt array followed by keyMsgEnd); for embeddings the input likewise.
// fastjson returns unescaped strings, so escaped and unescaped spellings give the same key.
// It does not allocate when dst has room. v must stay valid during the call.
func appendPromptKey(dst []byte, v *fastjson.Value, ep endpoint) []byte {
	switch ep {
	case epChat:
		for _, m := range v.GetArray("messages") {
			dst = append(dst, m.GetStringBytes("role")...)
			dst = append(dst, keyRoleSep)
			dst = appendContent(dst, m.Get("content"))
			dst = append(dst, keyMsgEnd)
		}
	case epCompletions:
		dst = appendTexts(dst, v.Get("prompt"))
	case epEmbeddings:
		dst = appendTexts(dst, v.Get("input"))
	}
	return dst
}

func appendContent(dst []byte, c *fastjson.Value) []byte {
	if c == nil {
		return dst
	}
	switch c.Type() {
	case fastjson.TypeString:
		dst = append(dst, c.GetStringBytes()...)
	case fastjson.TypeArray:
		for _, part := range c.GetArray() {
			if string(part.GetStringBytes("type")) == "text" {
				dst = append(dst, part.GetStringBytes("text")...)
			}
		}
	}
	return dst
}

func appendTexts(dst []byte, p *fastjson.Value) []byte {
	if p == nil {
		return dst
	}
	switch p.Type() {
	case fastjson.TypeString:
		dst = append(dst, p.GetStringBytes()...)
	case fastjson.TypeArray:
		for _, s := range p.GetArray() {
			switch s.Type() {
			case fastjson.TypeString:
				dst = append(dst, s.GetStringBytes()...)
			case fastjson.TypeNumber:
				// A prompt of token ids: the ids are the text.
				dst = strconv.AppendInt(dst, s.GetInt64(), 10)
				dst = append(dst, ',')
				continue
			case fastjson.TypeArray:
				dst = appendTexts(dst, s)
			}
			dst = append(dst, keyMsgEnd)
		}
	}
	return dst
}

// topLevelValue returns the byte span [start, end) of the first value of key in the top-level JSON object
// body (an empty span when there is none). body must be valid JSON (it was parsed before). It lets the model
// value be replaced without re-serialising the body; it stops at the key, usually the first one, so the rest
// of a long body is not scanned again. Keys written with escapes are compared unescaped.
func topLevelValue(body []byte, key string) (start, end int) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return 0, 0
	}
	i++
	for {
		i = skipSpace(body, i)
		if i >= len(body) || body[i] == '}' {
			return 0, 0
		}
		if body[i] == ',' {
			i++
			continue
		}
		if body[i] != '"' {
			return 0, 0
		}
		ks := i
		i = skipString(body, i)
		match := rawKeyEquals(body[ks:i], key)
		i = skipSpace(body, i)
		if i >= len(body) || body[i] != ':' {
			return 0, 0
		}
		i = skipSpace(body, i+1)
		vs := i
		i = skipValue(body, i)
		if match {
			return vs, i
		}
	}
}

func rawKeyEquals(quoted []byte, key string) bool {
	if len(quoted) < 2 {
		return false
	}
	raw := quoted[1 : len(quoted)-1]
	for _, c := range raw {
		if c == '\\' {
			s, err := strconv.Unquote(string(quoted))
			return err == nil && s == key
		}
	}
	return string(raw) == key
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the string starting at b[i] == '"'.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = skipString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return len(b)
	default:
		for ; i < len(b); i++ {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return i
			}
		}
		return i
	}
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
