package promptkey

import (
	"bytes"
	"strconv"
)

// messages scans the "messages" value (or the Responses "input" array) at i, the prompt field, (depth 2 if
// an array) and appends each message's key. It notes where the first user message ends (s.userEnd).
func (s *Scanner) messages(i int) int {
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
func (s *Scanner) input(i int) int {
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
func (s *Scanner) system(i int) int {
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
func (s *Scanner) message(i int) int {
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
func (s *Scanner) content(i, depth int) int {
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
func (s *Scanner) part(i, depth int) int {
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
func (s *Scanner) shortString(start, end int) []byte {
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
func (s *Scanner) texts(i int) int {
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
