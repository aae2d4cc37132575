package engine

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"strconv"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// endpoint is a data-plane API.
type endpoint uint8

const (
	epChat endpoint = iota
	epCompletions
	epEmbeddings
	epResponses // OpenAI's Responses API
	epMessages  // Anthropic-style Messages API, which vLLM serves too
	epOther     // any other POST /v1/* JSON body: routed by its model, on an empty prompt key
	numEndpoints
)

var endpointPaths = [numEndpoints]string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
	"/v1/messages", "/v1/*"}

// Prompt key separators (docs/architecture.md, "Prompt key"): the role and the text of a message are split by
// keyRoleSep and every message ends with keyMsgEnd, so "user: a" + "b" and "user: ab" differ, and roles
// cannot be confused with text. They are ASCII control characters that JSON text would have to escape.
// keyIdentity starts the identity prefix: keyIdentity and the 8-byte hash of the values that make the
// engine's cache differ for the same prompt (see requestScanner.identity), identityLen bytes in all.
const (
	keyRoleSep  = 0x1f // unit separator
	keyMsgEnd   = 0x1e // record separator
	keyIdentity = 0x1d // group separator
	identityLen = 9
)

// [server] cache_key_fields: at most maxKeyFields names of at most maxKeyFieldLen bytes each, so that any
// escaped spelling of one fits the scanner's name buffer (a byte is at most 6 bytes escaped, \u00XX).
const (
	maxKeyFields   = 8
	maxKeyFieldLen = 32
)

// noField is a top-level key no body has - keys are valid UTF-8 and it is not -, for an endpoint without
// the field.
const noField = "\xff"

// requestInfo is what the gateway reads from a request body.
type requestInfo struct {
	// model is the model value, unescaped. It aliases the body when the value has no escapes, else the
	// scanner's scratch; valid until the next scan with the same scanner or until the body changes.
	model []byte
	// modelStart, modelEnd: the byte span in the body of the model value token (the JSON string including
	// its quotes), for splicing another model in.
	modelStart, modelEnd int
	// stream: the last "stream" value is JSON true.
	stream bool
	// key is the prompt key, appended to the keyDst passed to scan (see requestScanner.scan).
	key []byte
	// opening is how many bytes of the key (after keyDst's own) are the conversation's opening: up to the
	// end of its first user message, or all of it when it has none.
	opening int
	// session is the body's "prompt_cache_key" when it is a string, unescaped, else nil. It aliases the body
	// when the value has no escapes, else the scanner's scratch; valid like model.
	session []byte
}

// keySpan is a byte range [at, end) of the body or of the key being built; at < 0 means none.
type keySpan struct{ at, end int }

// maxRequestDepth is the deepest nesting of objects and arrays accepted (the top-level object is depth 1).
// Python's json.loads fails with RecursionError somewhat deeper (~990 at the default recursion limit of
// 1000); 512 keeps the scanner's stack a fixed 64 bytes.
const maxRequestDepth = 512

// maxIntDigits is CPython's default int_max_str_digits: json.loads raises ValueError for an integer literal
// (no fraction, no exponent) with more digits, which FastAPI answers 400 (CVE-2020-10735,
// https://docs.python.org/3/library/stdtypes.html#int-max-str-digits).
const maxIntDigits = 4300

// requestScanner validates request bodies and reads a requestInfo from them in one pass, without building a
// value tree: its memory does not depend on how many values a body holds (the only scratch that grows is
// the unescaped model when it is written with escapes). It holds reusable scratch space; keep one per
// pooled call. Not safe for concurrent use.
type requestScanner struct {
	// keyFields are the top-level body fields whose values join cache_salt in the key's identity prefix
	// ([server] cache_key_fields, at most maxKeyFields). The scanner's owner sets them; scan only reads them.
	keyFields []string

	body []byte
	key  []byte // the prompt key being built; the caller's keyDst during a scan

	model   []byte // the unescaped model, when it has escapes
	session []byte // the unescaped prompt_cache_key, when it has escapes
	// name is an object key with escapes, unescaped: long enough for any escaped spelling of a key of up to
	// maxKeyFieldLen bytes.
	name [6 * maxKeyFieldLen]byte

	// Where the parts of the key are while it is built (finishKey puts them in order): the key bytes of the
	// prompt field and of the system field, the end of the first user message relative to main.at (-1:
	// none yet), and the body spans of the last cache_salt value and of each key field's.
	base      int
	main, sys keySpan
	userEnd   int
	ident     [1 + maxKeyFields]keySpan

	// objects has bit d-1 set when the container open at depth d (1-based) is an object (in skip).
	objects [maxRequestDepth / 64]uint64

	what string // the first parse error, "" if none
	at   int    // its byte offset
}

// promptField is the top-level key holding the prompt of each endpoint, and systemField the one holding its
// system message, for the endpoints that have it apart from the messages.
var (
	promptField = [numEndpoints]string{epChat: "messages", epCompletions: "prompt", epEmbeddings: "input",
		epResponses: "input", epMessages: "messages", epOther: noField}
	systemField = [numEndpoints]string{epChat: noField, epCompletions: noField, epEmbeddings: noField,
		epResponses: "instructions", epMessages: "system", epOther: noField}
)

// scan validates body as JSON the way Python's json.loads (vLLM's parser, through FastAPI) accepts it and
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
// of the scanner's keyFields: requests the engine caches apart never share a prefix (requestScanner.identity).
//
// Strings are unescaped, so escaped and unescaped spellings give the same key. Where a key repeats (in the
// top-level object, a message or a content part), the last value counts, as in Python. Shapes that do not
// match (messages not an array, content an object) add nothing.
//
// It returns nil or a 400 error; the error messages hold no bytes of the body. info.key is set in both cases
// (so a grown keyDst is not lost) but holds a key only on success. scan does not allocate once the model and
// session scratch are warm and keyDst has room. body must not change while info.model or info.session is
// in use.
func (s *requestScanner) scan(body []byte, ep endpoint, keyDst []byte, info *requestInfo) *apiError {
	s.body, s.key, s.what, s.at = body, keyDst, "", 0
	base := len(keyDst)
	s.base, s.main, s.sys, s.userEnd = base, keySpan{-1, -1}, keySpan{-1, -1}, -1
	nIdent := 1 + min(len(s.keyFields), maxKeyFields)
	for k := range nIdent {
		s.ident[k].at = -1
	}
	*info = requestInfo{}
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
		} else {
			for i >= 0 {
				var name []byte
				if name, i = s.objectKey(i); i < 0 {
					break
				}
				v := i
				switch string(name) {
				case "model":
					models++
					modelAt = v
					i = s.skip(v, 1)
					modelEnd = i
				case "stream":
					i = s.skip(v, 1)
					info.stream = i-v == 4 && body[v] == 't'
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
					for k := 1; k < nIdent; k++ {
						if string(name) == s.keyFields[k-1] {
							s.ident[k] = keySpan{v, i}
							break
						}
					}
				}
				if i = s.next(i, '}'); i < 0 || body[i-1] == '}' {
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
	var e *apiError
	switch {
	case s.what != "":
		e = badRequest("invalid_json", "", "cannot parse the request body as JSON: "+s.what+" at byte "+strconv.Itoa(s.at))
	case !object:
		e = badRequest("invalid_body", "", "the request body must be a JSON object")
	case models == 0:
		e = badRequest("missing_model", "model", "you must provide a model parameter")
	case models > 1:
		// Parsers disagree on duplicate keys (many take the first, Python's json - vLLM - the last), so a body
		// routed by one "model" must not reach the engine with another.
		e = badRequest("duplicate_model", "model", "the request body has more than one \"model\" key")
	case body[modelAt] != '"':
		e = badRequest("invalid_model", "model", "the model parameter must be a string")
	default:
		info.modelStart, info.modelEnd = modelAt, modelEnd
		info.model = body[modelAt+1 : modelEnd-1]
		if bytes.IndexByte(info.model, '\\') >= 0 {
			s.model, _ = s.str(s.model[:0], modelAt, true)
			info.model = s.model
		}
		if session >= 0 && body[session] == '"' {
			info.session = body[session+1 : sessionEnd-1]
			if bytes.IndexByte(info.session, '\\') >= 0 {
				s.session, _ = s.str(s.session[:0], session, true)
				info.session = s.session
			}
		}
		info.opening = s.finishKey(nIdent)
	}
	info.key = s.key
	s.body, s.key = nil, nil
	return e
}

// segment scans the value at v of the prompt field (seg is &s.main) or of the system field (seg is &s.sys,
// other the prompt field's) and appends its key. For a field that repeats the last value counts: the key
// of the earlier one is cut out first, and other moves down if it came after it.
func (s *requestScanner) segment(seg, other *keySpan, v int, ep endpoint) int {
	if seg.at >= 0 {
		n := seg.end - seg.at
		copy(s.key[seg.at:], s.key[seg.end:])
		s.key = s.key[:len(s.key)-n]
		if other.at > seg.at {
			other.at, other.end = other.at-n, other.end-n
		}
	}
	seg.at = len(s.key)
	var i int
	switch {
	case seg == &s.sys:
		i = s.system(v)
	case ep == epChat || ep == epMessages:
		s.userEnd = -1
		i = s.messages(v)
	case ep == epResponses:
		s.userEnd = -1
		i = s.input(v)
	default:
		i = s.texts(v)
	}
	seg.end = len(s.key)
	return i
}

// finishKey puts the parts of the key of a valid body in order - the identity prefix, the system message,
// the prompt field's key - and returns the length of the opening (requestInfo.opening). The parts were
// appended in the body's order; they are moved only when the body has them in another order, or has an
// identity.
func (s *requestScanner) finishKey(nIdent int) int {
	sysLen := 0
	if s.sys.at >= 0 {
		sysLen = s.sys.end - s.sys.at
		if s.main.at >= 0 && s.sys.at > s.main.at {
			s.rotate(s.main.at, s.sys.at)
		}
	}
	n := len(s.key) - s.base
	opening := n
	if s.main.at >= 0 && s.userEnd >= 0 {
		opening = sysLen + s.userEnd
	}
	if n == 0 {
		// No conversation: a prefix alone would make every request with the same salt a full match.
		return 0
	}
	if h, ok := s.identity(nIdent); ok {
		s.key = append(s.key, keyIdentity)
		s.key = binary.LittleEndian.AppendUint64(s.key, h)
		s.rotate(s.base, s.base+n)
		opening += identityLen
	}
	return opening
}

// identity returns the hash of what makes the engine cache the same prompt apart - the body's cache_salt
// (vLLM salts the first block's hash with it) and the values of the scanner's keyFields - or false when the
// body has none of them (null counts as none). A string counts by its unescaped text, another value by its
// JSON text as written, each with its field and whether it is a string. In front of the key (finishKey),
// the hash keeps requests of different identities from sharing any prefix in a trie, and the ones of one
// identity sharing theirs.
func (s *requestScanner) identity(nIdent int) (uint64, bool) {
	var acc [16 * (1 + maxKeyFields)]byte
	n := 0
	for k := range nIdent {
		sp := s.ident[k]
		if sp.at < 0 || s.body[sp.at] == 'n' {
			continue
		}
		v := s.body[sp.at:sp.end]
		var h uint64
		tag := uint64(k + 1)
		if v[0] != '"' {
			tag |= 1 << 8 // 1 and "1" differ
		}
		if v[0] == '"' && bytes.IndexByte(v, '\\') >= 0 {
			// Unescaped past the end of the key, hashed, and cut off again.
			mark := len(s.key)
			s.key, _ = s.str(s.key, sp.at, true)
			h = xxhash.Sum64(s.key[mark:])
			s.key = s.key[:mark]
		} else {
			if v[0] == '"' {
				v = v[1 : len(v)-1]
			}
			h = xxhash.Sum64(v)
		}
		binary.LittleEndian.PutUint64(acc[n:], tag)
		binary.LittleEndian.PutUint64(acc[n+8:], h)
		n += 16
	}
	if n == 0 {
		return 0, false
	}
	return xxhash.Sum64(acc[:n]), true
}

// rotate moves the key's tail s.key[m:] in front of s.key[a:m], using the spare room after the key for a
// copy of the shorter of the two.
func (s *requestScanner) rotate(a, m int) {
	n := len(s.key)
	if n-m <= m-a {
		s.key = append(s.key, s.key[m:n]...)
		copy(s.key[a+n-m:], s.key[a:m])
		copy(s.key[a:], s.key[n:])
	} else {
		s.key = append(s.key, s.key[a:m]...)
		copy(s.key[a:], s.key[m:])
	}
	s.key = s.key[:n]
}

// shrink drops the model and session scratch when it has grown past max bytes (an escaped value that long),
// so that a pooled scanner does not pin it.
func (s *requestScanner) shrink(max int) {
	if cap(s.model) > max {
		s.model = nil
	}
	if cap(s.session) > max {
		s.session = nil
	}
}

// fail records the first parse error and returns -1, the failed index every scanning method returns.
func (s *requestScanner) fail(what string, at int) int {
	if s.what == "" {
		s.what, s.at = what, at
	}
	return -1
}

// failAt reports what was expected at i, or the end of the input.
func (s *requestScanner) failAt(expected string, i int) int {
	if i >= len(s.body) {
		return s.fail("unexpected end of input", i)
	}
	return s.fail(expected, i)
}

// ws returns the index of the first byte at or after i that is not JSON whitespace (which is only space,
// \t, \n and \r, RFC 8259 section 2 and Python's json alike).
func (s *requestScanner) ws(i int) int {
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
func (s *requestScanner) objectKey(i int) ([]byte, int) {
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
func (s *requestScanner) member(i int, k1, k2 string) (v, name int) {
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
func (s *requestScanner) value(i int) int {
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
func (s *requestScanner) next(i int, closing byte) int {
	if b := s.body; i >= 0 && i+1 < len(b) && (b[i] == closing || b[i] == ',' && b[i+1] > ' ') {
		return i + 1
	}
	return s.nextSpace(i, closing)
}

func (s *requestScanner) nextSpace(i int, closing byte) int {
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

// messages scans the "messages" value (or the Responses "input" array) at i, the prompt field, (depth 2 if
// an array) and appends each message's key. It notes where the first user message ends (s.userEnd).
func (s *requestScanner) messages(i int) int {
	b := s.body
	if b[i] != '[' {
		return s.skip(i, 1)
	}
	if i = s.ws(i + 1); i < len(b) && b[i] == ']' {
		return i + 1
	}
	for {
		start := len(s.key)
		if i < len(b) && b[i] == '{' {
			i = s.message(i)
		} else {
			// Not an object: no role, no content.
			i = s.skip(i, 2)
			s.key = append(s.key, keyRoleSep, keyMsgEnd)
		}
		if s.userEnd < 0 && len(s.key)-start > 5 && string(s.key[start:start+5]) == "user\x1f" {
			s.userEnd = len(s.key) - s.main.at
		}
		if i = s.next(i, ']'); i < 0 || b[i-1] == ']' {
			return i
		}
	}
}

// input scans the Responses "input" value at i (in the top-level object): a string is one user message, an
// array holds items taken as chat messages (items without a role, such as tool calls, add an empty one).
func (s *requestScanner) input(i int) int {
	switch s.body[i] {
	case '"':
		s.key = append(s.key, "user\x1f"...)
		s.key, i = s.str(s.key, i, true)
		s.key = append(s.key, keyMsgEnd)
		s.userEnd = len(s.key) - s.main.at
		return i
	case '[':
		return s.messages(i)
	}
	return s.skip(i, 1)
}

// system scans the Responses "instructions" or the Messages "system" value at i (in the top-level object)
// and appends it as a system message: a string, or the text parts of an array like a message's content.
// Anything else (null) adds nothing.
func (s *requestScanner) system(i int) int {
	if c := s.body[i]; c != '"' && c != '[' {
		return s.skip(i, 1)
	}
	s.key = append(s.key, "system\x1f"...)
	i = s.content(i, 1)
	s.key = append(s.key, keyMsgEnd)
	return i
}

// message scans the message object at i (depth 3) and appends its key: role, keyRoleSep, content text,
// keyMsgEnd. The last "role" and the last "content" count, in whichever order they come. In the usual
// case - one role, then one content - they are appended as they are scanned; otherwise the message's key is
// rebuilt at its end from the two values, scanning the content a second time (so each byte is scanned at
// most twice).
func (s *requestScanner) message(i int) int {
	b := s.body
	start := len(s.key)
	role, content := -1, -1       // where the last role and content values start
	keyRole, keyContent := -1, -1 // the values appended as they were scanned
	if i = s.ws(i + 1); i < len(b) && b[i] == '}' {
		i++
	} else {
		for {
			v, name := plainKey(b, i, "role"), 1
			if v < 0 {
				v, name = plainKey(b, i, "content"), 2
			}
			if v < 0 {
				v, name = s.member(i, "role", "content")
			} else {
				v = s.value(v)
			}
			if v < 0 {
				return v
			}
			switch name {
			case 1: // role
				role = v
				if keyRole < 0 && content < 0 {
					if b[v] == '"' {
						s.key, i = s.str(s.key, v, true)
					} else {
						i = s.skip(v, 3)
					}
					s.key = append(s.key, keyRoleSep)
					keyRole = v
				} else {
					i = s.skip(v, 3)
				}
			case 2: // content
				content = v
				if keyRole >= 0 && keyContent < 0 {
					i = s.content(v, 3)
					keyContent = v
				} else {
					i = s.skip(v, 3)
				}
			default:
				i = s.skip(v, 3)
			}
			if i = s.next(i, '}'); i < 0 {
				return i
			}
			if b[i-1] == '}' {
				break
			}
		}
	}
	if keyRole < 0 || keyRole != role || keyContent != content {
		s.key = s.key[:start]
		if role >= 0 && b[role] == '"' {
			s.key, _ = s.str(s.key, role, true)
		}
		s.key = append(s.key, keyRoleSep)
		if content >= 0 {
			s.content(content, 3)
		}
	}
	s.key = append(s.key, keyMsgEnd)
	return i
}

// content scans a content value at i, held in an object at depth (a message, depth 3, or the top-level
// object for a system field) and appends its text.
func (s *requestScanner) content(i, depth int) int {
	b := s.body
	switch b[i] {
	case '"':
		s.key, i = s.str(s.key, i, true)
		return i
	case '[':
	default:
		return s.skip(i, depth)
	}
	if i = s.ws(i + 1); i < len(b) && b[i] == ']' {
		return i + 1
	}
	for {
		if i < len(b) && b[i] == '{' {
			i = s.part(i, depth+2)
		} else {
			i = s.skip(i, depth+1)
		}
		if i = s.next(i, ']'); i < 0 || b[i-1] == ']' {
			return i
		}
	}
}

// part scans the content part object at i (at depth: 5 in a message) and appends its "text" when its "type"
// is a text type (textPart); the last of each counts. Usually "type" comes first and the text is appended
// as it is scanned; otherwise it is appended at the part's end, scanning the text a second time.
func (s *requestScanner) part(i, depth int) int {
	b := s.body
	start := len(s.key)
	isText := false
	text, keyText := -1, -1 // where the last "text" value starts; the one appended as it was scanned
	if i = s.ws(i + 1); i < len(b) && b[i] == '}' {
		return i + 1
	}
	for {
		v, name := plainKey(b, i, "type"), 1
		if v < 0 {
			v, name = plainKey(b, i, "text"), 2
		}
		if v < 0 {
			v, name = s.member(i, "type", "text")
		} else {
			v = s.value(v)
		}
		if v < 0 {
			return v
		}
		switch name {
		case 1: // type
			isText = false
			if len(b)-v >= 6 && string(b[v:v+6]) == `"text"` {
				isText, i = true, v+6
			} else if b[v] != '"' {
				i = s.skip(v, depth)
			} else if _, i = s.str(nil, v, false); i >= 0 {
				isText = textPart(s.shortString(v, i))
			}
		case 2: // text
			text = v
			if isText && keyText < 0 && b[v] == '"' {
				s.key, i = s.str(s.key, v, true)
				keyText = v
			} else {
				i = s.skip(v, depth)
			}
		default:
			i = s.skip(v, depth)
		}
		if i = s.next(i, '}'); i < 0 {
			return i
		}
		if b[i-1] == '}' {
			break
		}
	}
	if !isText || text < 0 || b[text] != '"' {
		text = -1
	}
	if text != keyText {
		s.key = s.key[:start]
		if text >= 0 {
			s.key, _ = s.str(s.key, text, true)
		}
	}
	return i
}

// textPart reports whether a content part's type holds text for the prompt key: "text" (chat, Anthropic
// blocks), "input_text" and "output_text" (Responses items, which vLLM's chat parser takes as text too).
func textPart(typ []byte) bool {
	switch string(typ) {
	case "text", "input_text", "output_text":
		return true
	}
	return false
}

// shortString returns the valid JSON string [start, end) of the body unescaped: aliasing the body when it
// has no escapes, else s.name (valid until the next call), or nil when it is too long to be a name the
// scanner looks for.
func (s *requestScanner) shortString(start, end int) []byte {
	name := s.body[start+1 : end-1]
	if bytes.IndexByte(name, '\\') < 0 {
		return name
	}
	if len(name) > len(s.name) {
		return nil
	}
	name, _ = s.str(s.name[:0], start, true)
	return name
}

// texts scans the completions "prompt" or embeddings "input" value at i (in the top-level object, depth 1)
// and appends its text: a string's text, or for an array each string + keyMsgEnd, each number's token id +
// ',', each nested array likewise + keyMsgEnd, anything else keyMsgEnd. Nested arrays are followed with a
// counter, not recursion: they are all arrays.
func (s *requestScanner) texts(i int) int {
	b := s.body
	switch b[i] {
	case '"':
		s.key, i = s.str(s.key, i, true)
		return i
	case '[':
	default:
		return s.skip(i, 1)
	}
	depth := 1 // of the container holding the value at i
	for {
		// i is at a value in a texts array, or at the prompt array itself when depth is 1.
		switch c := b[i]; {
		case c == '[':
			if depth++; depth > maxRequestDepth {
				return s.fail("nesting deeper than 512", i)
			}
			if i = s.ws(i + 1); i >= len(b) || b[i] != ']' {
				if i >= len(b) {
					return s.fail("unexpected end of input", i)
				}
				continue
			}
			i++
			if depth--; depth > 1 {
				s.key = append(s.key, keyMsgEnd)
			}
		case c == '"':
			s.key, i = s.str(s.key, i, true)
			s.key = append(s.key, keyMsgEnd)
		case c == '-' || c >= '0' && c <= '9' || c == 'N' || c == 'I':
			v := i
			if i = s.scalar(i); i >= 0 {
				s.key = strconv.AppendInt(s.key, tokenID(b[v:i]), 10)
				s.key = append(s.key, ',')
			}
		default:
			i = s.skip(i, depth)
			s.key = append(s.key, keyMsgEnd)
		}
		for {
			if depth == 1 || i < 0 {
				return i
			}
			if i = s.next(i, ']'); i < 0 || b[i-1] != ']' {
				break
			}
			if depth--; depth > 1 {
				s.key = append(s.key, keyMsgEnd)
			}
		}
		if i < 0 {
			return i
		}
	}
}

// tokenID returns the int64 value of a JSON number token, or 0 when it is not an integer that fits int64
// (as fastjson's GetInt64, which keyed token ids before; NaN and Infinity give 0 too).
func tokenID(num []byte) int64 {
	neg := num[0] == '-'
	if neg {
		num = num[1:]
	}
	if len(num) == 0 || len(num) > 19 {
		return 0
	}
	var n uint64
	for _, c := range num {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + uint64(c-'0')
	}
	switch {
	case neg && n <= 1<<63:
		return int64(-n)
	case !neg && n < 1<<63:
		return int64(n)
	}
	return 0
}

// skip validates the value at i, held in a container at depth (0 for the top-level value), and returns
// the index after it. It follows nesting with a bit per level in s.objects, not recursion.
func (s *requestScanner) skip(i, depth int) int {
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
func (s *requestScanner) closing(depth, base int) byte {
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
func (s *requestScanner) scalar(i int) int {
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

// str validates the JSON string at i (b[i] == '"') and returns the index after it; when keep is set it
// appends the string unescaped to dst. Escapes are JSON's only (RFC 8259 section 7); a \u escape of a
// surrogate that is not part of a pair, which Python accepts, is appended as U+FFFD. Control characters
// are refused, as Python's json.loads does in strict mode (its default), and the bytes must be valid UTF-8:
// FastAPI cannot decode a body that is not.
//
// The string is taken in runs between escapes: plainRun passes over printable ASCII 32 bytes at a time
// (AVX2) to the closing quote, the next backslash or another byte; from a byte that is not ASCII,
// bytes.IndexByte finds the closing quote and the next backslash (SIMD in the runtime) and plainEnd checks
// the run as UTF-8 8 bytes at a time. BenchmarkScanRequest measures it.
func (s *requestScanner) str(dst []byte, i int, keep bool) ([]byte, int) {
	b := s.body
	i++
	// Short ASCII strings (roles, names, ids) end in their first words: checked 8 bytes at a time, they
	// need no call.
	run := i // the bytes from run on are not appended yet
	for j := i; len(b)-j >= 8 && j-run < 32; j += 8 {
		if m := strSpecial(binary.LittleEndian.Uint64(b[j:])); m != 0 {
			k := j + bits.TrailingZeros64(m)>>3
			if b[k] == '"' {
				if keep {
					dst = append(dst, b[run:k]...)
				}
				return dst, k + 1
			}
			i = k // the bytes before k are plain
			break
		}
		i = j + 8
	}
	q := -1 // the next '"' at or after the non-ASCII byte last met; len(b) if there is none
	for {
		e := i // the end of the run: a quote, a backslash, or the first byte plainRun stops at
		if e < len(b) && b[e] < utf8.RuneSelf {
			e += plainRun(b[i:])
		}
		if e < len(b) && b[e] >= utf8.RuneSelf {
			// Not ASCII: to the quote or the next backslash, checked as UTF-8 by plainEnd.
			if q < e {
				if q = bytes.IndexByte(b[e:], '"'); q < 0 {
					q = len(b)
				} else {
					q += e
				}
			}
			end := q
			if n := bytes.IndexByte(b[e:q], '\\'); n >= 0 {
				end = e + n
			}
			if j := plainEnd(b, e, end); j < end {
				if b[j] < 0x20 {
					return dst, s.fail("control character in a string", j)
				}
				return dst, s.fail("invalid UTF-8", j)
			}
			e = end
		} else if e < len(b) && b[e] < 0x20 {
			return dst, s.fail("control character in a string", e)
		}
		if keep {
			dst = append(dst, b[run:e]...)
		}
		if e == len(b) {
			return dst, s.fail("unexpected end of input", e)
		}
		if b[e] == '"' {
			return dst, e + 1
		}
		// A backslash at e.
		if e+1 >= len(b) {
			return dst, s.fail("unexpected end of input", len(b))
		}
		var r rune
		i = e + 2
		switch b[e+1] {
		case '"', '\\', '/':
			r = rune(b[e+1])
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		case 'u':
			if r = hex4(b, i); r < 0 {
				return dst, s.fail("invalid \\u escape", e)
			}
			i += 4
			if r >= 0xd800 && r < 0xe000 {
				// A high surrogate followed by an escaped low one is one code point; any other surrogate is
				// kept alone by Python, and is not a code point UTF-8 can hold.
				if r < 0xdc00 && len(b)-i >= 6 && b[i] == '\\' && b[i+1] == 'u' {
					if r2 := hex4(b, i+2); r2 >= 0xdc00 && r2 < 0xe000 {
						r = 0x10000 + (r-0xd800)<<10 + (r2 - 0xdc00)
						i += 6
					}
				}
				if r < 0x10000 {
					r = utf8.RuneError
				}
			}
		default:
			return dst, s.fail("invalid escape", e)
		}
		if keep {
			dst = utf8.AppendRune(dst, r)
		}
		run = i
	}
}

const (
	lsb = 0x0101010101010101 // the low bit of each byte of a word
	msb = 0x8080808080808080 // the high bit of each byte of a word
)

// strSpecial returns a mask with the high bit set of the lowest byte of x that is '"', '\\', a control
// character or >= 0x80 (bits above it may be set too), or 0 when there is none. It uses the "haszero" and
// "hasless" expressions of https://graphics.stanford.edu/~seander/bithacks.html#ZeroInWord: a byte below
// 0x80 gets its high bit set by "- lsb" only when it is 0 (x^'"' or x^'\\'), by "- 0x20" only when it is
// below 0x20; any higher byte is flagged by "| x". A borrow can flag bytes above a flagged one, never below.
func strSpecial(x uint64) uint64 {
	return ((x ^ (lsb * '"') - lsb) | (x ^ (lsb * '\\') - lsb) | (x - lsb*0x20) | x) & msb
}

// plainEnd returns the index of the first byte of b[i:e] that is a control character or not valid UTF-8
// (RFC 3629), or e. It checks 32 bytes at a time, then 8, while they are ASCII or whole 2-byte sequences
// (Latin, Greek, Cyrillic, Hebrew, Arabic), without a branch per byte (see plainWord), and other bytes one
// sequence at a time. BenchmarkScanRequest shows the gain: this is most of the time a chat body takes.
func plainEnd(b []byte, i, e int) int {
	start := i
	for i < e {
		var pend uint64 // a lead byte ended the last word
		for e-i >= 32 {
			p := b[i : i+32]
			if (binary.LittleEndian.Uint64(p)|binary.LittleEndian.Uint64(p[8:])|binary.LittleEndian.Uint64(p[16:])|binary.LittleEndian.Uint64(p[24:]))&msb == 0 {
				// ASCII: only control characters to refuse.
				ctrl := (binary.LittleEndian.Uint64(p) - lsb*0x20) | (binary.LittleEndian.Uint64(p[8:]) - lsb*0x20) |
					(binary.LittleEndian.Uint64(p[16:]) - lsb*0x20) | (binary.LittleEndian.Uint64(p[24:]) - lsb*0x20)
				if (ctrl|pend)&msb != 0 {
					break
				}
				i += 32
				continue
			}
			// The words are loaded again rather than kept: fewer live registers, no spills.
			bad, lead := plainWord(binary.LittleEndian.Uint64(p), pend)
			b1, l1 := plainWord(binary.LittleEndian.Uint64(p[8:]), lead>>56)
			bad |= b1
			b2, l2 := plainWord(binary.LittleEndian.Uint64(p[16:]), l1>>56)
			bad |= b2
			b3, l3 := plainWord(binary.LittleEndian.Uint64(p[24:]), l2>>56)
			if (bad|b3)&msb != 0 {
				break
			}
			pend = l3 >> 56
			i += 32
		}
		for e-i >= 8 {
			bad, lead := plainWord(binary.LittleEndian.Uint64(b[i:]), pend)
			if bad&msb != 0 {
				break
			}
			pend = lead >> 56
			i += 8
		}
		if e-i < 8 && e-start >= 8 {
			// The last bytes, as the word ending at e: the bytes before i in it are plain already, and
			// b[p-1] tells whether b[p] must continue a sequence.
			p := e - 8
			var pp uint64
			if p > 0 && b[p-1] >= 0xc0 {
				pp = 0x80
			}
			if bad, lead := plainWord(binary.LittleEndian.Uint64(b[p:]), pp); (bad|lead>>56)&msb == 0 {
				return e
			}
		}
		if pend != 0 {
			i-- // the lead that ended the last word is checked with its continuation below
		}
		// One sequence at a time to e, or past the 32 bytes the loops stopped at.
		for stop := min(e, i+32); i < stop; {
			if c := b[i]; c >= 0x20 && c < utf8.RuneSelf {
				i++
				continue
			} else if c < 0x20 {
				return i
			}
			r, n := utf8.DecodeRune(b[i:e])
			if r == utf8.RuneError && n == 1 {
				return i
			}
			i += n
		}
	}
	return e
}

// plainWord checks the 8 bytes of w for plainEnd: bad has a byte's high bit set (or a higher byte's) when
// that byte is a control character or not part of a whole 2-byte UTF-8 sequence; lead marks the lead bytes,
// so that lead>>56 tells the next word its first byte must continue a sequence (pend). hi marks the bytes
// >= 0x80, lead those 11xxxxxx, hi^lead the continuations 10xxxxxx. The word is plain when no byte is below
// 0x20 ((w-0x20)&^w as in strSpecial); every lead is 0xc2-0xdf, that is its bits 5-1 (w&0x3e) are 0x02-0x1e
// (bit 5 clear: 2 bytes; bits 4-1 not all 0: not an overlong encoding), which is when w&0x3e^0x20 is at
// least 0x22, so adding 0x5e sets its high bit (without a carry out of the byte); and the continuations are
// exactly the bytes after a lead.
func plainWord(w, pend uint64) (bad, lead uint64) {
	hi := w & msb
	lead = hi & (w << 1)
	bad = (w - lsb*0x20) &^ w
	bad |= hi ^ lead ^ (lead<<8 | pend)
	bad |= lead &^ (w&(lsb*0x3e) ^ lsb*0x20 + lsb*0x5e)
	return bad, lead
}

// hex4 returns the value of the 4 hex digits at b[i:], or -1.
func hex4(b []byte, i int) rune {
	if len(b)-i < 4 {
		return -1
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
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

// plainRun returns the length of b's leading run of printable ASCII bytes other than '"' and '\\': the bytes
// a JSON string holds as they are, and all a prompt in English is made of between its escapes. It checks
// 32 bytes at a time where the CPU can (plainRunBlocks), then 8.
func plainRun(b []byte) int {
	i := plainRunBlocks(b)
	for ; len(b)-i >= 8; i += 8 {
		if m := strSpecial(binary.LittleEndian.Uint64(b[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	for ; i < len(b); i++ {
		if c := b[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' {
			return i
		}
	}
	return i
}
