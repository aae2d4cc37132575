package promptkey

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// scanErrorMessage is every message scan answers a body that is not JSON with: none holds a byte of the body.
var scanErrorMessage = regexp.MustCompile(`^cannot parse the request body as JSON: (` + strings.Join([]string{
	"unexpected end of input", "unexpected data after the top-level value", "expected a value", "expected a string key",
	"expected ':' after an object key", `expected ',' or '\}'`, `expected ',' or '\]'`, "invalid literal", "invalid number",
	"integer with more than 4300 digits", "nesting deeper than 512", "control character in a string", "invalid UTF-8",
	`invalid \\u escape`, "invalid escape",
}, "|") + `) at byte [0-9]+$`)

// FuzzScanRequest checks scan against encoding/json: it never panics; it takes a body as JSON exactly when
// json.Valid does, but for the documented differences from Go (NaN, Infinity and -Infinity and one leading
// BOM taken as Python does, invalid UTF-8, nesting deeper than 512 and integers of more than 4300 digits
// refused); its model, stream, prompt_cache_key, prompt key (identity prefix included, with "user" as a
// cache key field) and opening are those of the body decoded by encoding/json (which keeps the last of
// repeated keys, as Python); and splicing another model into the model span gives a body with that model
// and nothing else changed.
func FuzzScanRequest(f *testing.F) {
	for _, seed := range []string{
		chat20, `{"model":"m"}`, `{"model":"m","prompt":["a",[1,-2,1.5],{"x":NaN}],"stream":true}`,
		`{"model":"m","input":[[1,2],"x"]}`, `{"m\u006fdel":"\ud83d\ude00","messages":[{"content":"a","role":"u"}]}`,
		`{"model":"a","model":"b"}`, "\xef\xbb\xbf{\"model\":\"m\"}", `[NaN,-Infinity]`, `{"model":"m","x":"\x6d"}`,
		`{"model":"m","messages":[{"role":"user","content":[{"text":"b","type":"text"},{"type":"text","text":"c","text":"d"}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("abcé€", 20) + `
"}]}`,
		`{"model":"m","prompt":"` + strings.Repeat("x", 40) + "\x00" + strings.Repeat("é", 20) + `"}`,
		// Long printable ASCII, the vector blocks' case, with escapes, a quote and a non-ASCII byte inside.
		`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("plain text, ", 12) + `\n` +
			strings.Repeat("more ", 15) + `\"q\" ` + strings.Repeat("and ", 20) + "é" + strings.Repeat("x", 70) + `"}]}`,
		// Responses, Messages, identities and session keys.
		`{"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"function_call","name":"f"}],"model":"m","instructions":"be brief"}`,
		`{"model":"m","input":"hi","instructions":[{"type":"text","text":"s"}],"input":"again","cache_salt":"s\u00e9"}`,
		`{"model":"m","system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"q"}]}]}`,
		`{"messages":[{"role":"assistant","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"}],"system":"s","model":"m","user":{"id":[1, 2]}}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"cache_salt":null,"user":7,"prompt_cache_key":"c\u0061che","prompt_cache_key":"k"}`,
	} {
		for ep := range NumEndpoints {
			f.Add([]byte(seed), uint8(ep))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, epn uint8) {
		ep := Endpoint(epn % uint8(NumEndpoints))
		s := Scanner{KeyFields: []string{"user"}}
		var info Info
		e := s.Scan(body, ep, nil, &info)
		if e != nil && e.Code == "invalid_json" && !scanErrorMessage.MatchString(e.Message) {
			t.Fatalf("scan(%q): message %q", body, e.Message)
		}
		valid := e == nil || e.Code != "invalid_json"
		want, comparable := goValid(body)
		if comparable && valid != want {
			t.Fatalf("scan(%q): valid JSON = %v (%v), encoding/json says %v", body, valid, e, want)
		}
		if !valid {
			return
		}
		ref := decodeReference(body, ep)
		if ref.ok {
			code := ""
			if e != nil {
				code = e.Code
			}
			if code != ref.code {
				t.Fatalf("scan(%q) = %q, want %q", body, code, ref.code)
			}
			if e == nil && (string(info.Model) != ref.model || info.Stream != ref.stream || string(info.Key) != ref.key ||
				info.Opening != ref.opening || string(info.Session) != ref.session || (info.Session != nil) != ref.hasSession) {
				t.Fatalf("scan(%q): model %q stream %v key %q opening %d session %q; encoding/json: %q %v %q %d %q", body,
					info.Model, info.Stream, info.Key, info.Opening, info.Session, ref.model, ref.stream, ref.key, ref.opening, ref.session)
			}
		}
		if e != nil {
			return
		}
		if info.Opening < 0 || info.Opening > len(info.Key) || (len(info.Key) > 0) != (info.Opening > 0) {
			t.Fatalf("scan(%q): opening %d of a key of %d bytes", body, info.Opening, len(info.Key))
		}
		model, stream, key := string(info.Model), info.Stream, string(info.Key)
		spliced := append(append(append([]byte(nil), body[:info.ModelStart]...), `"other"`...), body[info.ModelEnd:]...)
		if e := s.Scan(spliced, ep, nil, &info); e != nil {
			t.Fatalf("scan(%q) = %s after splicing into %q (model %q)", spliced, e.Message, body, model)
		}
		if string(info.Model) != "other" || info.Stream != stream || string(info.Key) != key {
			t.Fatalf("scan(%q): model %q stream %v key %q after splicing, want other %v %q", spliced, info.Model, info.Stream, info.Key, stream, key)
		}
	})
}

// goValid reports whether body is JSON for Python as far as json.Valid can tell: the BOM stripped, invalid
// UTF-8 refused, NaN, Infinity and -Infinity replaced by a value Go takes ("[0]", which cannot join a
// neighbour into something valid), nesting deeper than 512 refused. comparable is false for bodies with long
// digit runs (Python's integer limit, which json.Valid does not know).
func goValid(body []byte) (valid, comparable bool) {
	b := bytes.TrimPrefix(body, []byte("\xef\xbb\xbf"))
	if !utf8.Valid(b) {
		return false, true
	}
	digits, depth, maxDepth, in := 0, 0, 0, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c >= '0' && c <= '9' {
			if digits++; digits > maxIntDigits {
				return false, false
			}
			continue
		}
		digits = 0
		switch {
		case in && c == '\\':
			i++
		case c == '"':
			in = !in
		case !in && (c == '[' || c == '{'):
			depth++
			maxDepth = max(maxDepth, depth)
		case !in && (c == ']' || c == '}'):
			depth--
		}
	}
	if maxDepth > maxRequestDepth {
		return false, true
	}
	for _, lit := range []string{"-Infinity", "Infinity", "NaN"} {
		b = bytes.ReplaceAll(b, []byte(lit), []byte("[0]"))
	}
	return json.Valid(b), true
}

// reference is what a request body says according to encoding/json.
type reference struct {
	ok         bool // the body could be decoded (no NaN or Infinity, which Go refuses)
	code       string
	model      string
	stream     bool
	key        string
	opening    int
	session    string
	hasSession bool // prompt_cache_key is a string
}

func decodeReference(body []byte, ep Endpoint) reference {
	dec := json.NewDecoder(bytes.NewReader(bytes.TrimPrefix(body, []byte("\xef\xbb\xbf"))))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return reference{}
	}
	if tok != json.Delim('{') {
		return reference{ok: true, code: "invalid_body"}
	}
	var r reference
	models := 0
	var model, prompt, system any
	// The identity: cache_salt, then the fuzz scanner's one key field, "user".
	idents := []string{"cache_salt", "user"}
	identRaw := make([]json.RawMessage, len(idents))
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return reference{}
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return reference{}
		}
		vdec := json.NewDecoder(bytes.NewReader(raw))
		vdec.UseNumber()
		var v any
		if err := vdec.Decode(&v); err != nil {
			return reference{}
		}
		switch k {
		case "model":
			models++
			model = v
		case "stream":
			r.stream = v == true
		case promptField[ep]:
			prompt = v
		case systemField[ep]:
			system = v
		case "prompt_cache_key":
			r.session, r.hasSession = v.(string)
		}
		for j, name := range idents {
			if k == name {
				identRaw[j] = raw
			}
		}
	}
	if _, err := dec.Token(); err != nil {
		return reference{}
	}
	r.ok = true
	ms, isString := model.(string)
	switch {
	case models == 0:
		r.code = "missing_model"
	case models > 1:
		r.code = "duplicate_model"
	case !isString:
		r.code = "invalid_model"
	}
	r.model = ms
	var key []byte
	switch system.(type) {
	case string, []any:
		key = append(key, "system\x1f"...)
		key = referenceContent(key, system)
		key = append(key, keyMsgEnd)
	}
	userEnd := -1
	switch ep {
	case Chat, Messages, Responses:
		if s, ok := prompt.(string); ok && ep == Responses {
			key = append(append(append(key, "user\x1f"...), s...), keyMsgEnd)
			userEnd = len(key)
			break
		}
		messages, _ := prompt.([]any)
		for _, m := range messages {
			m, _ := m.(map[string]any)
			role, _ := m["role"].(string)
			key = append(append(key, role...), keyRoleSep)
			key = referenceContent(key, m["content"])
			key = append(key, keyMsgEnd)
			if role == "user" && userEnd < 0 {
				userEnd = len(key)
			}
		}
	case Completions, Embeddings:
		key = referenceTexts(key, prompt)
	}
	r.opening = len(key)
	if userEnd >= 0 {
		r.opening = userEnd
	}
	// The identity prefix: keyIdentity and the hash of (index and kind, hash of the value) of the values
	// present and not null, a string by its text, another value by its JSON text.
	var acc []byte
	for j, raw := range identRaw {
		if raw == nil || string(raw) == "null" {
			continue
		}
		v, tag := []byte(raw), uint64(j+1)|1<<8
		var str string
		if json.Unmarshal(raw, &str) == nil {
			v, tag = []byte(str), uint64(j+1)
		}
		acc = binary.LittleEndian.AppendUint64(acc, tag)
		acc = binary.LittleEndian.AppendUint64(acc, xxhash.Sum64(v))
	}
	if len(acc) > 0 && len(key) > 0 {
		key = append(binary.LittleEndian.AppendUint64([]byte{keyIdentity}, xxhash.Sum64(acc)), key...)
		r.opening += identityLen
	}
	r.key = string(key)
	return r
}

// referenceContent appends the text of a message content: a string, or the text parts of an array.
func referenceContent(key []byte, content any) []byte {
	switch c := content.(type) {
	case string:
		key = append(key, c...)
	case []any:
		for _, p := range c {
			p, _ := p.(map[string]any)
			if text, ok := p["text"].(string); ok && (p["type"] == "text" || p["type"] == "input_text" || p["type"] == "output_text") {
				key = append(key, text...)
			}
		}
	}
	return key
}

func referenceTexts(key []byte, v any) []byte {
	switch v := v.(type) {
	case string:
		return append(key, v...)
	case []any:
		for _, e := range v {
			switch e := e.(type) {
			case string:
				key = append(key, e...)
			case json.Number:
				n, _ := strconv.ParseInt(string(e), 10, 64)
				key = strconv.AppendInt(key, n, 10)
				key = append(key, ',')
				continue
			case []any:
				key = referenceTexts(key, e)
			}
			key = append(key, keyMsgEnd)
		}
	}
	return key
}
