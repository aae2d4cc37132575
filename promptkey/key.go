package promptkey

import (
	"bytes"
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// Prompt key separators (docs/architecture.md, "Prompt key"): the role and the text of a message are split by
// keyRoleSep and every message ends with keyMsgEnd, so "user: a" + "b" and "user: ab" differ, and roles
// cannot be confused with text. They are ASCII control characters that JSON text would have to escape.
// keyIdentity starts the identity prefix: keyIdentity and the 8-byte hash of the values that make the
// engine's cache differ for the same prompt (see Scanner.identity), identityLen bytes in all.
const (
	keyRoleSep  = 0x1f // unit separator
	keyMsgEnd   = 0x1e // record separator
	keyIdentity = 0x1d // group separator
	identityLen = 9
)

// keySpan is a byte range [at, end) of the body or of the key being built; at < 0 means none.
type keySpan struct{ at, end int }

// segment scans the value at v of the prompt field (seg is &s.main) or of the system field (seg is &s.sys,
// other the prompt field's) and appends its key. For a field that repeats the last value counts: the key
// of the earlier one is cut out first, and other moves down if it came after it.
func (s *Scanner) segment(seg, other *keySpan, v int, ep Endpoint) int {
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
	case ep == Chat || ep == Messages:
		s.userEnd = -1
		i = s.messages(v)
	case ep == Responses:
		s.userEnd = -1
		i = s.input(v)
	default:
		i = s.texts(v)
	}
	seg.end = len(s.key)
	return i
}

// finishKey puts the parts of the key of a valid body in order - the identity prefix, the system message,
// the prompt field's key - and returns the length of the opening (Info.Opening). The parts were
// appended in the body's order; they are moved only when the body has them in another order, or has an
// identity.
func (s *Scanner) finishKey(nIdent int) int {
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
// (vLLM salts the first block's hash with it) and the values of the scanner's KeyFields - or false when the
// body has none of them (null counts as none). A string counts by its unescaped text, another value by its
// JSON text as written, each with its field and whether it is a string. In front of the key (finishKey),
// the hash keeps requests of different identities from sharing any prefix in a trie, and the ones of one
// identity sharing theirs.
func (s *Scanner) identity(nIdent int) (uint64, bool) {
	var acc [16 * (1 + MaxKeyFields)]byte
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
func (s *Scanner) rotate(a, m int) {
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
