package promptkey

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"unicode/utf8"
)

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
func (s *Scanner) str(dst []byte, i int, keep bool) ([]byte, int) {
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
