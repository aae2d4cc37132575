package disagg

import "strconv"

// maxDepth is the deepest nesting of objects and arrays accepted (a top-level object is depth 1). Python's
// json.loads, which both vLLM and SGLang parse bodies with, fails somewhat deeper (about 990 at the default
// recursion limit); 512 keeps the scanner's stack a fixed 64 bytes, as in promptkey.
const maxDepth = 512

// SyntaxError is why a body or an answer is not the JSON the protocol needs. Its fields hold no bytes of
// the input, so it can be logged or shown to a client as it is.
type SyntaxError struct {
	// Offset is the byte at which the scan stopped.
	Offset int
	// Msg says what was wrong there.
	Msg string
}

func (e *SyntaxError) Error() string {
	return "invalid JSON at byte " + strconv.Itoa(e.Offset) + ": " + e.Msg
}

func syntaxError(i int, msg string) error { return &SyntaxError{Offset: i, Msg: msg} }

// member is one member of a top-level object, as subslices of the scanned bytes: the key between its
// quotes (still escaped) and the value.
type member struct {
	key   []byte
	value []byte
}

// object walks the members of the top-level object in b, strictly (RFC 8259: strings, escapes, numbers,
// literals, nesting up to maxDepth), calling visit for each member in order. It returns the index of
// the object's closing brace. Whitespace may surround the object; anything else around it is an error.
// Work is linear in len(b) and nothing is allocated unless an error is returned.
func object(b []byte, visit func(m member)) (end int, err error) {
	i := ws(b, 0)
	if i >= len(b) || b[i] != '{' {
		return -1, syntaxError(i, "not a JSON object")
	}
	i = ws(b, i+1)
	if i < len(b) && b[i] == '}' {
		end = i
	} else {
		for {
			var m member
			if m.key, i, err = key(b, i); err != nil {
				return -1, err
			}
			start := i
			if i, err = value(b, i, 1); err != nil {
				return -1, err
			}
			m.value = b[start:i]
			visit(m)
			if i = ws(b, i); i >= len(b) {
				return -1, syntaxError(i, "unexpected end of input")
			}
			if b[i] == '}' {
				end = i
				break
			}
			if b[i] != ',' {
				return -1, syntaxError(i, "expected ',' or '}' after an object member")
			}
			i = ws(b, i+1)
		}
	}
	if i = ws(b, end+1); i != len(b) {
		return -1, syntaxError(i, "data after the top-level object")
	}
	return end, nil
}

// key scans the object key at i (whitespace before it already skipped), its colon, and the whitespace after: it
// returns the key between its quotes and the index of the member's value.
func key(b []byte, i int) (k []byte, next int, err error) {
	if i >= len(b) || b[i] != '"' {
		return nil, -1, syntaxError(i, "expected a string as an object key")
	}
	j, err := str(b, i)
	if err != nil {
		return nil, -1, err
	}
	k = b[i+1 : j-1]
	if j = ws(b, j); j >= len(b) || b[j] != ':' {
		return nil, -1, syntaxError(j, "expected ':' after an object key")
	}
	return k, ws(b, j+1), nil
}

// value scans the value at i, found at nesting depth depth (its container's), and returns the index just
// after it. Nesting is tracked in a fixed bit stack (a set bit is an object), so the work is iterative and
// bounded by len(b).
func value(b []byte, i, depth int) (int, error) {
	var objects [maxDepth / 64]uint64
	base := depth
	var err error
	for {
		// i is at a value.
		if i >= len(b) {
			return -1, syntaxError(i, "unexpected end of input")
		}
		switch c := b[i]; c {
		case '"':
			if i, err = str(b, i); err != nil {
				return -1, err
			}
		case '{', '[':
			if depth++; depth > maxDepth {
				return -1, syntaxError(i, "nesting deeper than 512")
			}
			d := uint(depth - 1)
			if c == '{' {
				objects[d/64] |= 1 << (d % 64)
			} else {
				objects[d/64] &^= 1 << (d % 64)
			}
			i = ws(b, i+1)
			if i < len(b) && b[i] == c+2 { // '}' or ']': an empty container, a whole value
				i++
				depth--
				break // out of the switch, to what follows a value
			}
			if c == '{' {
				if _, i, err = key(b, i); err != nil {
					return -1, err
				}
			}
			continue
		default:
			if i, err = scalar(b, i); err != nil {
				return -1, err
			}
		}
		// After a value: close containers until a ',' leads to the next value.
		for {
			if depth == base {
				return i, nil
			}
			d := uint(depth - 1)
			isObject := objects[d/64]&(1<<(d%64)) != 0
			closing := byte(']')
			if isObject {
				closing = '}'
			}
			if i = ws(b, i); i >= len(b) {
				return -1, syntaxError(i, "unexpected end of input")
			}
			if b[i] == closing {
				i++
				depth--
				continue
			}
			if b[i] != ',' {
				return -1, syntaxError(i, "expected ',' or '"+string(closing)+"'")
			}
			i = ws(b, i+1)
			if isObject {
				if _, i, err = key(b, i); err != nil {
					return -1, err
				}
			}
			break
		}
	}
}

// str scans the string whose opening quote is at i and returns the index after its closing quote. It
// refuses raw control characters and unknown escapes, as Python's json.loads does (strict mode).
func str(b []byte, i int) (int, error) {
	for j := i + 1; j < len(b); j++ {
		// Most bytes of a string need no look: skip them in a tight loop (BenchmarkScan).
		for j < len(b) && plain[b[j]] {
			j++
		}
		if j >= len(b) {
			break
		}
		switch c := b[j]; {
		case c == '"':
			return j + 1, nil
		case c < 0x20:
			return -1, syntaxError(j, "control character in a string")
		default: // '\\'
			if j++; j >= len(b) {
				return -1, syntaxError(j, "unexpected end of input")
			}
			switch b[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(b) {
					return -1, syntaxError(j, "unexpected end of input")
				}
				for k := j + 1; k <= j+4; k++ {
					if hexValue(b[k]) < 0 {
						return -1, syntaxError(k, "invalid \\u escape")
					}
				}
				j += 4
			default:
				return -1, syntaxError(j, "invalid escape")
			}
		}
	}
	return -1, syntaxError(len(b), "unterminated string")
}

// plain marks the bytes a string may hold as they are: all but the quote, the backslash and controls.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// scalar scans the number or literal (true, false, null) at i and returns the index after it.
func scalar(b []byte, i int) (int, error) {
	switch b[i] {
	case 't':
		return literal(b, i, "true")
	case 'f':
		return literal(b, i, "false")
	case 'n':
		return literal(b, i, "null")
	}
	return number(b, i)
}

func literal(b []byte, i int, lit string) (int, error) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return -1, syntaxError(i, "invalid literal")
	}
	return i + len(lit), nil
}

// number scans a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func number(b []byte, i int) (int, error) {
	start := i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i)
	default:
		return -1, syntaxError(start, "invalid value")
	}
	if i < len(b) && b[i] == '.' {
		if j := digits(b, i+1); j == i+1 {
			return -1, syntaxError(j, "invalid number")
		} else {
			i = j
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return -1, syntaxError(j, "invalid number")
		}
		i = j
	}
	return i, nil
}

func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// ws skips JSON whitespace (space, tab, line feed, carriage return) from i.
func ws(b []byte, i int) int {
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

func hexValue(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// keyIs reports whether the raw (still escaped) key k spells name, which is ASCII without quotes or
// backslashes. Python decodes escapes in keys, so "stream\u005foptions" is stream_options to vLLM.
func keyIs(k []byte, name string) bool {
	n := 0
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c == '\\' {
			// str validated the escape.
			i++
			switch k[i] {
			case 'u':
				r := 0
				for _, h := range k[i+1 : i+5] {
					r = r<<4 | hexValue(h)
				}
				i += 4
				if r >= 0x80 {
					return false
				}
				c = byte(r)
			case 'b':
				c = '\b'
			case 'f':
				c = '\f'
			case 'n':
				c = '\n'
			case 'r':
				c = '\r'
			case 't':
				c = '\t'
			default: // '"', '\\', '/'
				c = k[i]
			}
		}
		if n >= len(name) || name[n] != c {
			return false
		}
		n++
	}
	return n == len(name)
}
