package promptkey

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"strconv"
)

// Info is what the gateway reads from a request body.
type Info struct {
	// Model is the model value, unescaped. It aliases the body when the value has no escapes, else the
	// scanner's scratch; valid until the next scan with the same scanner or until the body changes.
	Model []byte
	// ModelStart, ModelEnd: the byte span in the body of the model value token (the JSON string including
	// its quotes), for splicing another model in.
	ModelStart, ModelEnd int
	// Stream: the last "stream" value is JSON true.
	Stream bool
	// Key is the prompt key, appended to the keyDst passed to Scan (see Scanner.Scan).
	Key []byte
	// Opening is how many bytes of the key (after keyDst's own) are the conversation's opening: up to the
	// end of its first user message, or all of it when it has none.
	Opening int
	// Session is the body's "prompt_cache_key" when it is a string, unescaped, else nil. It aliases the body
	// when the value has no escapes, else the scanner's scratch; valid like Model.
	Session []byte
	// End is the index of the body object's closing brace, Members how many members the object has, and
	// Overrides which of the keys a disaggregated route's prefill request overrides it holds (Override*
	// bits): where a gateway appends members of its own, found in the same pass.
	End, Members int
	Overrides    uint8
	// MaxTokens is the last "max_tokens", "max_completion_tokens" or "max_output_tokens" value that is a
	// non-negative JSON integer (up to 2^53), else 0: the most the answer may generate.
	MaxTokens int64
}

// The top-level keys a prefill request of vLLM's disaggregation protocol overrides when the body has them,
// as bits of Info.Overrides (in the order of disagg's keys).
const (
	OverrideStreamOptions uint8 = 1 << iota
	OverrideMaxCompletionTokens
	OverrideMinTokens
	OverrideMinCompletionTokens
)

// override returns the Override bit of a top-level key, or 0.
func override(name []byte) uint8 {
	switch string(name) {
	case "stream_options":
		return OverrideStreamOptions
	case "max_completion_tokens":
		return OverrideMaxCompletionTokens
	case "min_tokens":
		return OverrideMinTokens
	case "min_completion_tokens":
		return OverrideMinCompletionTokens
	}
	return 0
}

// Scanner validates request bodies and reads an Info from them in one pass, without building a
// value tree: its memory does not depend on how many values a body holds (the only scratch that grows is
// the unescaped model when it is written with escapes). It holds reusable scratch space; keep one per
// pooled call. Not safe for concurrent use.
type Scanner struct {
	// KeyFields are the top-level body fields whose values join cache_salt in the key's identity prefix
	// ([server] cache_key_fields, at most MaxKeyFields). The scanner's owner sets them; Scan only reads them.
	KeyFields []string

	body []byte
	key  []byte // the prompt key being built; the caller's keyDst during a scan

	model   []byte // the unescaped model, when it has escapes
	session []byte // the unescaped prompt_cache_key, when it has escapes
	// name is an object key with escapes, unescaped: long enough for any escaped spelling of a key of up to
	// MaxKeyFieldLen bytes.
	name [6 * MaxKeyFieldLen]byte

	// Where the parts of the key are while it is built (finishKey puts them in order): the key bytes of the
	// prompt field and of the system field, the end of the first user message relative to main.at (-1:
	// none yet), and the body spans of the last cache_salt value and of each key field's.
	base      int
	main, sys keySpan
	userEnd   int
	ident     [1 + MaxKeyFields]keySpan

	// objects has bit d-1 set when the container open at depth d (1-based) is an object (in skip).
	objects [maxRequestDepth / 64]uint64

	what string // the first parse error, "" if none
	at   int    // its byte offset
}

// Scan validates body as JSON the way Python's json.loads (vLLM's parser, through FastAPI) accepts it and
// fills info in one pass: the model value and its span, stream, prompt_cache_key, and the prompt key
// appended to keyDst with the length of its opening.
//
// The prompt key is the conversation itself, not the JSON (docs/architecture.md, "Prompt key"): for chat,
// each element of "messages" in order gives its role, keyRoleSep, its text (a string content, or the "text"
// of each part of an array content whose "type" is "text", "input_text" or "output_text", in order) and
// keyMsgEnd; for completions the "prompt" string, or for a prompt array each string followed by keyMsgEnd,
// each number (a token id: its decimal value if it is an integer that fits int64, else 0) followed by ',',
// each nested array the same way followed by keyMsgEnd, and anything else as keyMsgEnd alone; for embeddings
// the "input" likewise. Responses: "instructions" (a string, or content parts) as a "system" message, then
// "input" - a string as one "user" message, or an array of items taken as chat messages. Messages
// (Anthropic): "system" (a string or text blocks) as a "system" message, then "messages" as chat. So one
// conversation has one key whichever of the three endpoints carries it. Other endpoints have no key.
//
// A non-empty key starts with the identity prefix when the body has a non-null cache_salt (vLLM's) or one
// of the scanner's KeyFields: requests the engine caches apart never share a prefix (Scanner.identity).
//
// Strings are unescaped, so escaped and unescaped spellings give the same key. Where a key repeats (in the
// top-level object, a message or a content part), the last value counts, as in Python. Shapes that do not
// match (messages not an array, content an object) add nothing.
//
// It returns nil or an *Error (the engine answers it 400); the error messages hold no bytes of the body. info.Key is set in both cases
// (so a grown keyDst is not lost) but holds a key only on success. Scan does not allocate once the model and
// session scratch are warm and keyDst has room. body must not change while info.Model or info.Session is
// in use.
func (s *Scanner) Scan(body []byte, ep Endpoint, keyDst []byte, info *Info) *Error {
	s.body, s.key, s.what, s.at = body, keyDst, "", 0
	base := len(keyDst)
	s.base, s.main, s.sys, s.userEnd = base, keySpan{-1, -1}, keySpan{-1, -1}, -1
	nIdent := 1 + min(len(s.KeyFields), MaxKeyFields)
	for k := range nIdent {
		s.ident[k].at = -1
	}
	*info = Info{}
	models, modelAt, modelEnd := 0, 0, 0
	session, sessionEnd := -1, 0 // the last prompt_cache_key value
	object := false

	i := 0
	if len(body) >= 3 && body[0] == 0xef && body[1] == 0xbb && body[2] == 0xbf {
		// Python's json.loads decodes bytes with utf-8-sig: one leading BOM is skipped.
		i = 3
	}
	i = s.ws(i)
	if i < len(body) && body[i] == '{' {
		object = true
		i = s.ws(i + 1)
		if i < len(body) && body[i] == '}' {
			i++
			info.End = i - 1
		} else {
			for i >= 0 {
				var name []byte
				if name, i = s.objectKey(i); i < 0 {
					break
				}
				info.Members++
				v := i
				switch string(name) {
				case "model":
					models++
					modelAt = v
					i = s.skip(v, 1)
					modelEnd = i
				case "stream":
					i = s.skip(v, 1)
					info.Stream = i-v == 4 && body[v] == 't'
				case "max_tokens", "max_completion_tokens", "max_output_tokens":
					i = s.skip(v, 1)
					if n, ok := jsonCount(body[v:max(i, v)]); ok {
						info.MaxTokens = n
					}
					if len(name) >= len("min_tokens") {
						info.Overrides |= override(name)
					}
				case promptField[ep]:
					i = s.segment(&s.main, &s.sys, v, ep)
				case systemField[ep]:
					i = s.segment(&s.sys, &s.main, v, ep)
				case "cache_salt":
					i = s.skip(v, 1)
					s.ident[0] = keySpan{v, i}
				case "prompt_cache_key":
					i = s.skip(v, 1)
					session, sessionEnd = v, i
				default:
					i = s.skip(v, 1)
					if len(name) >= len("min_tokens") {
						info.Overrides |= override(name)
					}
					for k := 1; k < nIdent; k++ {
						if string(name) == s.KeyFields[k-1] {
							s.ident[k] = keySpan{v, i}
							break
						}
					}
				}
				if i = s.next(i, '}'); i < 0 || body[i-1] == '}' {
					if i > 0 {
						info.End = i - 1
					}
					break
				}
			}
		}
	} else if i < len(body) {
		i = s.skip(i, 0)
	} else {
		s.fail("unexpected end of input", i)
	}
	if i >= 0 {
		if i = s.ws(i); i < len(body) {
			s.fail("unexpected data after the top-level value", i)
		}
	}
	var e *Error
	switch {
	case s.what != "":
		e = invalid("invalid_json", "", "cannot parse the request body as JSON: "+s.what+" at byte "+strconv.Itoa(s.at))
	case !object:
		e = invalid("invalid_body", "", "the request body must be a JSON object")
	case models == 0:
		e = invalid("missing_model", "model", "you must provide a model parameter")
	case models > 1:
		// Parsers disagree on duplicate keys (many take the first, Python's json - vLLM - the last), so a body
		// routed by one "model" must not reach the engine with another.
		e = invalid("duplicate_model", "model", "the request body has more than one \"model\" key")
	case body[modelAt] != '"':
		e = invalid("invalid_model", "model", "the model parameter must be a string")
	default:
		info.ModelStart, info.ModelEnd = modelAt, modelEnd
		info.Model = body[modelAt+1 : modelEnd-1]
		if bytes.IndexByte(info.Model, '\\') >= 0 {
			s.model, _ = s.str(s.model[:0], modelAt, true)
			info.Model = s.model
		}
		if session >= 0 && body[session] == '"' {
			info.Session = body[session+1 : sessionEnd-1]
			if bytes.IndexByte(info.Session, '\\') >= 0 {
				s.session, _ = s.str(s.session[:0], session, true)
				info.Session = s.session
			}
		}
		info.Opening = s.finishKey(nIdent)
	}
	info.Key = s.key
	s.body, s.key = nil, nil
	return e
}

// Shrink drops the model and session scratch when it has grown past max bytes (an escaped value that long),
// so that a pooled scanner does not pin it.
func (s *Scanner) Shrink(max int) {
	if cap(s.model) > max {
		s.model = nil
	}
	if cap(s.session) > max {
		s.session = nil
	}
}

// fail records the first parse error and returns -1, the failed index every scanning method returns.
func (s *Scanner) fail(what string, at int) int {
	if s.what == "" {
		s.what, s.at = what, at
	}
	return -1
}

// failAt reports what was expected at i, or the end of the input.
func (s *Scanner) failAt(expected string, i int) int {
	if i >= len(s.body) {
		return s.fail("unexpected end of input", i)
	}
	return s.fail(expected, i)
}

// ws returns the index of the first byte at or after i that is not JSON whitespace (which is only space,
// \t, \n and \r, RFC 8259 section 2 and Python's json alike).
func (s *Scanner) ws(i int) int {
	b := s.body
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// objectKey reads the object key at or after whitespace from i and the ':' after it. It returns the key
// unescaped (aliasing the body or s.name, valid until the next objectKey; nil when it is too long to be one
// the scanner looks for) and the index of the value, which is in the body, or -1.
func (s *Scanner) objectKey(i int) ([]byte, int) {
	b := s.body
	if i = s.ws(i); i >= len(b) || b[i] != '"' {
		return nil, s.failAt("expected a string key", i)
	}
	var name []byte
	if len(b)-i > 8 {
		// A key of up to 7 bytes without escapes ends in its first word: most keys.
		if m := strSpecial(binary.LittleEndian.Uint64(b[i+1:])); m != 0 {
			if k := i + 1 + bits.TrailingZeros64(m)>>3; b[k] == '"' {
				name, i = b[i+1:k], k+1
			}
		}
	}
	if name == nil {
		start := i
		if _, i = s.str(nil, i, false); i < 0 {
			return nil, i
		}
		name = s.shortString(start, i)
	}
	if i = s.ws(i); i >= len(b) || b[i] != ':' {
		return nil, s.failAt("expected ':' after an object key", i)
	}
	if i = s.ws(i + 1); i >= len(b) {
		return nil, s.fail("unexpected end of input", i)
	}
	return name, i
}

// member reads the object key at i (at its quote, or whitespace before it) and returns the index of its
// value (in the body) or -1, and which of the names k1 and k2 it is: 1, 2, or 0 for another. The callers
// look for k1 and k2 spelled plainly first (plainKey), a compare each: they are the keys a chat body repeats
// in every message or content part.
func (s *Scanner) member(i int, k1, k2 string) (v, name int) {
	var key []byte
	if key, v = s.objectKey(i); v >= 0 {
		if string(key) == k1 {
			name = 1
		} else if string(key) == k2 {
			name = 2
		}
	}
	return v, name
}

// plainKey returns the index after `"name":` at i, or -1 when the key at i is not name spelled without
// escapes, followed directly by ':'. Inlined with a constant name, it is a few compares.
func plainKey(b []byte, i int, name string) int {
	if j := i + len(name) + 2; j < len(b) && b[i] == '"' && string(b[i+1:j-1]) == name && b[j-1] == '"' && b[j] == ':' {
		return j + 1
	}
	return -1
}

// value returns the index of the value at or after whitespace from i, or -1 at the end of the body.
func (s *Scanner) value(i int) int {
	if i < len(s.body) && s.body[i] > ' ' {
		return i
	}
	if i = s.ws(i); i >= len(s.body) {
		return s.fail("unexpected end of input", i)
	}
	return i
}

// next reads the ',' or the closing byte after a member or element that ended at i. It returns the index
// after it (after ',', the index of the next member or element, which is in the body) or -1; the caller
// tells which from the byte before the index. next takes the usual case, no whitespace; nextSpace the rest.
func (s *Scanner) next(i int, closing byte) int {
	if b := s.body; i >= 0 && i+1 < len(b) && (b[i] == closing || b[i] == ',' && b[i+1] > ' ') {
		return i + 1
	}
	return s.nextSpace(i, closing)
}

func (s *Scanner) nextSpace(i int, closing byte) int {
	if i < 0 {
		return i
	}
	b := s.body
	if i = s.ws(i); i < len(b) {
		if b[i] == closing {
			return i + 1
		}
		if b[i] == ',' {
			if i = s.ws(i + 1); i >= len(b) {
				return s.fail("unexpected end of input", i)
			}
			return i
		}
	}
	if closing == '}' {
		return s.failAt("expected ',' or '}'", i)
	}
	return s.failAt("expected ',' or ']'", i)
}

// skip validates the value at i, held in a container at depth (0 for the top-level value), and returns
// the index after it. It follows nesting with a bit per level in s.objects, not recursion.
func (s *Scanner) skip(i, depth int) int {
	b := s.body
	base := depth
	var closing byte // of the container at depth, when depth > base
	for {
		// i is at a value.
		if i >= len(b) {
			return s.fail("unexpected end of input", i)
		}
		switch c := b[i]; c {
		case '"':
			_, i = s.str(nil, i, false)
		case '{', '[':
			if depth++; depth > maxRequestDepth {
				return s.fail("nesting deeper than 512", i)
			}
			d := uint(depth - 1)
			if c == '{' {
				s.objects[d/64] |= 1 << (d % 64)
			} else {
				s.objects[d/64] &^= 1 << (d % 64)
			}
			closing = c + 2 // '}' or ']'
			if i = s.ws(i + 1); i >= len(b) || b[i] != closing {
				if c == '{' {
					_, i = s.objectKey(i)
				}
				if i < 0 {
					return i
				}
				continue
			}
			i++
			depth--
			closing = s.closing(depth, base)
		default:
			i = s.scalar(i)
		}
		// After a value: close containers until a ',' leads to the next value.
		for {
			if depth == base || i < 0 {
				return i
			}
			if i = s.next(i, closing); i < 0 {
				return i
			}
			if b[i-1] != closing {
				if closing == '}' {
					_, i = s.objectKey(i)
				}
				break
			}
			depth--
			closing = s.closing(depth, base)
		}
		if i < 0 {
			return i
		}
	}
}

// closing returns the byte that closes the container open at depth (1-based) in skip, or 0 at base.
func (s *Scanner) closing(depth, base int) byte {
	if depth == base {
		return 0
	}
	if d := uint(depth - 1); s.objects[d/64]&(1<<(d%64)) != 0 {
		return '}'
	}
	return ']'
}

// scalar validates the number or literal at i and returns the index after it: the literals are
// Python's json ones, true, false, null, NaN, Infinity and -Infinity (case-sensitive); numbers follow RFC
// 8259 section 6, and an integer may have at most maxIntDigits digits.
func (s *Scanner) scalar(i int) int {
	b := s.body
	if c := b[i]; c > '9' || c < '0' && (c != '-' || i+1 < len(b) && b[i+1] == 'I') {
		lit := ""
		switch c {
		case 't':
			lit = "true"
		case 'f':
			lit = "false"
		case 'n':
			lit = "null"
		case 'N':
			lit = "NaN"
		case 'I':
			lit = "Infinity"
		case '-':
			lit = "-Infinity"
		default:
			return s.fail("expected a value", i)
		}
		if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
			return s.fail("invalid literal", i)
		}
		return i + len(lit)
	}
	start := i
	if b[i] == '-' {
		i++
	}
	digits := i
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i++; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		}
	default:
		return s.fail("invalid number", start)
	}
	integer := i - digits
	if i < len(b) && b[i] == '.' {
		integer = 0
		if i++; i >= len(b) || b[i] < '0' || b[i] > '9' {
			return s.fail("invalid number", start)
		}
		for i++; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		integer = 0
		if i++; i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return s.fail("invalid number", start)
		}
		for i++; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		}
	}
	if integer > maxIntDigits {
		return s.fail("integer with more than 4300 digits", start)
	}
	return i
}

// jsonCount reads b, a JSON value, as a non-negative integer of at most 2^53 (written without a fraction
// or exponent); ok is false for anything else.
func jsonCount(b []byte) (n int64, ok bool) {
	if len(b) == 0 || len(b) > 16 || len(b) > 1 && b[0] == '0' {
		return 0, false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, n <= 1<<53
}
