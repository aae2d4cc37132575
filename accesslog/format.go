package accesslog

import (
	"net/netip"
	"strconv"
	"time"
	"unicode/utf8"
	"unsafe"
)

// timeLayout is RFC 3339 with milliseconds; times are written in UTC, so the zone is always "Z".
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// AppendJSON appends r as one JSON object and a newline to dst and returns the extended buffer. Every key
// of the field list (package doc) is present, null when the value is unknown.
func AppendJSON(dst []byte, r *Record) []byte { return appendRecord(dst, r, false) }

// AppendText appends r as one line of key=value pairs to dst and returns the extended buffer. Fields with
// no value are left out.
func AppendText(dst []byte, r *Record) []byte { return appendRecord(dst, r, true) }

// appendRecord writes the field list once for both formats, so they cannot drift apart.
func appendRecord(dst []byte, r *Record, text bool) []byte {
	e := encoder{b: dst, text: text}
	if !text {
		e.b = append(e.b, '{')
	}
	e.time("time", r.Time)
	// A string over the id's bytes, used only during this call (no copy of the bytes).
	e.str("request_id", unsafe.String(&r.RequestID[0], int(r.RequestIDLen)))
	e.addr("client", r.Client)
	e.str("path", r.Path)
	e.str("route", r.Route)
	e.str("model", r.Model)
	e.str("target", r.Target)
	e.str("prefill_target", r.PrefillTarget)
	e.str("strategy", r.Strategy)
	e.str("decision", r.Decision)
	e.score("score", r.Score)
	e.int("status", int64(r.Status), r.Status != 0)
	e.int("retries", int64(r.Retries), true)
	e.ms("upstream_headers_ms", r.UpstreamHeaders)
	e.ms("first_byte_ms", r.FirstByte)
	e.ms("duration_ms", r.Duration)
	e.int("bytes_out", r.BytesOut, true)
	e.int("prompt_tokens", r.PromptTokens, r.PromptTokens >= 0)
	e.int("cached_tokens", r.CachedTokens, r.CachedTokens >= 0)
	e.bool("stream", r.Stream)
	e.str("error", r.Error)
	e.hex("trace_id", r.TraceID[:])
	e.hex("span_id", r.SpanID[:])
	if !text {
		e.b = append(e.b, '}')
	}
	return append(e.b, '\n')
}

// encoder writes fields in JSON (`"key":value`, null for unknown values) or text (`key=value`, unknown
// values left out).
type encoder struct {
	b      []byte
	text   bool
	fields int
}

// key starts a field.
func (e *encoder) key(k string) {
	if e.fields > 0 {
		if e.text {
			e.b = append(e.b, ' ')
		} else {
			e.b = append(e.b, ',')
		}
	}
	e.fields++
	if e.text {
		e.b = append(e.b, k...)
		e.b = append(e.b, '=')
		return
	}
	e.b = append(e.b, '"')
	e.b = append(e.b, k...)
	e.b = append(e.b, '"', ':')
}

// null writes an unknown value: null in JSON, nothing in text.
func (e *encoder) null(k string) {
	if !e.text {
		e.key(k)
		e.b = append(e.b, "null"...)
	}
}

func (e *encoder) str(k, v string) {
	if v == "" {
		e.null(k)
		return
	}
	e.key(k)
	if e.text && !needsQuote(v) {
		e.b = append(e.b, v...)
		return
	}
	e.b = append(e.b, '"')
	e.b = appendEscaped(e.b, v)
	e.b = append(e.b, '"')
}

// raw writes a value that needs neither quotes in text nor escaping in JSON strings.
func (e *encoder) raw(k string, quoted bool, v []byte) {
	e.key(k)
	if quoted && !e.text {
		e.b = append(e.b, '"')
		e.b = append(e.b, v...)
		e.b = append(e.b, '"')
		return
	}
	e.b = append(e.b, v...)
}

func (e *encoder) time(k string, t time.Time) {
	if t.IsZero() {
		e.null(k)
		return
	}
	var buf [40]byte
	e.raw(k, true, t.UTC().AppendFormat(buf[:0], timeLayout))
}

func (e *encoder) addr(k string, a netip.AddrPort) {
	if !a.IsValid() {
		e.null(k)
		return
	}
	var buf [64]byte
	e.raw(k, true, a.AppendTo(buf[:0]))
}

func (e *encoder) int(k string, v int64, known bool) {
	if !known {
		e.null(k)
		return
	}
	var buf [24]byte
	e.raw(k, false, strconv.AppendInt(buf[:0], v, 10))
}

func (e *encoder) bool(k string, v bool) {
	var buf [8]byte
	e.raw(k, false, strconv.AppendBool(buf[:0], v))
}

// score writes the prefix-match fraction with 4 decimals, as the x-rolter-prefix-match header does.
func (e *encoder) score(k string, v float64) {
	if !(v >= 0) { // -1 and NaN: no cache strategy decided
		e.null(k)
		return
	}
	var buf [32]byte
	e.raw(k, false, strconv.AppendFloat(buf[:0], v, 'f', 4, 64))
}

// ms writes d in milliseconds with 3 decimals (microseconds, truncated); 0 means not reached.
func (e *encoder) ms(k string, d time.Duration) {
	if d <= 0 {
		e.null(k)
		return
	}
	var buf [32]byte
	b := strconv.AppendInt(buf[:0], int64(d/time.Millisecond), 10)
	us := int64(d%time.Millisecond) / int64(time.Microsecond)
	b = append(b, '.', byte('0'+us/100), byte('0'+us/10%10), byte('0'+us%10))
	e.raw(k, false, b)
}

func (e *encoder) hex(k string, id []byte) {
	zero := true
	for _, c := range id {
		if c != 0 {
			zero = false
			break
		}
	}
	if zero {
		e.null(k)
		return
	}
	const digits = "0123456789abcdef"
	var buf [32]byte
	for i, c := range id {
		buf[2*i], buf[2*i+1] = digits[c>>4], digits[c&15]
	}
	e.raw(k, true, buf[:2*len(id)])
}

// needsQuote reports whether a text value must be quoted: when it is not plain printable ASCII, or holds
// a byte that would end the value or start a quoted one (space, '=', '"', '\').
func needsQuote(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == '=' || c == '"' || c == '\\' {
			return true
		}
	}
	return false
}

// appendEscaped appends s as the inside of a JSON string, for both formats (a quoted text value is a JSON
// string too). Beyond what JSON requires (quote, backslash, controls below 0x20) it escapes what could
// forge or disguise a line on a terminal or in a viewer: DEL, the C1 controls (U+0080-U+009F, of which
// U+009B starts a terminal escape sequence), the line and paragraph separators U+2028 and U+2029, and
// the bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069). Invalid UTF-8 becomes
// \ufffd, so the output is always valid UTF-8.
func appendEscaped(dst []byte, s string) []byte {
	const digits = "0123456789abcdef"
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= ' ' && c != '"' && c != '\\' && c != 0x7f {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', digits[c>>4], digits[c&15])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r <= 0x9f, r == 0x2028, r == 0x2029, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', digits[r>>12], digits[r>>8&15], digits[r>>4&15], digits[r&15])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	return append(dst, s[start:]...)
}
