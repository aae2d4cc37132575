package tracing

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
)

// FlagSampled is the sampled bit of the trace flags (W3C Trace Context, section 3.2.2.5).
const FlagSampled = 0x01

// TraceparentLen is the length of a version 00 traceparent value.
const TraceparentLen = 55

// MaxTracestateLen is the longest tracestate value forwarded; vendors must propagate at least 512 bytes
// (W3C Trace Context, section 3.3.1.5), and a longer one may be cut by any hop anyway.
const MaxTracestateLen = 512

// TraceContext is a W3C trace context: the trace, the span that is the parent of the next hop, and the
// trace flags. The zero value is "no trace context" (all-zero ids are invalid on the wire).
type TraceContext struct {
	TraceID [16]byte
	SpanID  [8]byte
	Flags   byte
}

// Sampled reports whether the sampled flag is set.
func (tc TraceContext) Sampled() bool { return tc.Flags&FlagSampled != 0 }

// IsValid reports whether both ids are non-zero.
func (tc TraceContext) IsValid() bool { return tc.TraceID != [16]byte{} && tc.SpanID != [8]byte{} }

// ParseTraceparent parses a traceparent header value (W3C Trace Context level 1, section 3.2). Version
// 00 must be exactly version-traceid-parentid-flags, 55 characters of lowercase hex and dashes. A higher
// version is parsed for its first four fields when it is at least 55 characters long and the flags are
// followed by the end or a dash (section 3.2.4), and only its sampled flag is kept. Version ff, uppercase
// hex, and an all-zero trace id or parent id are invalid. Spaces and tabs around the value (HTTP optional
// whitespace) are ignored. ParseTraceparent does not allocate and does not keep b.
//
// A request with more than one traceparent header has none (the caller checks): when the value is
// invalid, the tracestate must be ignored too (section 3.3).
func ParseTraceparent(b []byte) (TraceContext, bool) {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	var tc TraceContext
	if len(b) < TraceparentLen || b[2] != '-' || b[35] != '-' || b[52] != '-' {
		return tc, false
	}
	version, ok := hexByte(b[0], b[1])
	if !ok || version == 0xff {
		return tc, false
	}
	if version == 0 && len(b) != TraceparentLen {
		return tc, false
	}
	if len(b) > TraceparentLen && b[TraceparentLen] != '-' {
		return tc, false
	}
	if !decodeHex(tc.TraceID[:], b[3:35]) || !decodeHex(tc.SpanID[:], b[36:52]) {
		return TraceContext{}, false
	}
	flags, ok := hexByte(b[53], b[54])
	if !ok || !tc.IsValid() {
		return TraceContext{}, false
	}
	if version != 0 {
		// A later version may give the other bits other meanings.
		flags &= FlagSampled
	}
	tc.Flags = flags
	return tc, true
}

// AppendTraceparent appends tc as a version 00 traceparent value to dst and returns the extended buffer.
// It does not allocate when dst has TraceparentLen bytes of spare capacity.
func AppendTraceparent(dst []byte, tc TraceContext) []byte {
	n := len(dst)
	dst = slices.Grow(dst, TraceparentLen)[:n+TraceparentLen]
	b := dst[n:]
	b[0], b[1], b[2], b[35], b[52] = '0', '0', '-', '-', '-'
	encodeHex(b[3:35], tc.TraceID[:])
	encodeHex(b[36:52], tc.SpanID[:])
	b[53], b[54] = hexDigits[tc.Flags>>4], hexDigits[tc.Flags&15]
	return dst
}

// ValidTracestate reports whether a tracestate header value may be passed on unchanged: 1 to 512 bytes
// of printable ASCII (spaces and tabs included, as optional whitespace around list members). The list
// members themselves are not parsed: the gateway adds no member of its own, so it forwards the value
// as it came, and the next hop applies the full grammar.
func ValidTracestate(b []byte) bool {
	if len(b) == 0 || len(b) > MaxTracestateLen {
		return false
	}
	for _, c := range b {
		if (c < 0x20 && c != '\t') || c > 0x7e {
			return false
		}
	}
	return true
}

// NewTraceContext returns the trace context of the gateway's own span for one request: a new random
// span id, in the parent's trace when there is one (hasParent), else in a new random trace. The sampled
// flag follows the parent when there is one (a sampled caller's trace stays sampled, an unsampled one
// stays unsampled), else sampler decides on the new trace id. The result is what the gateway sends
// upstream in traceparent, so the engine's spans become children of the gateway's. It does not allocate;
// the ids come from math/rand/v2's per-thread ChaCha8 source.
func NewTraceContext(parent TraceContext, hasParent bool, sampler Sampler) TraceContext {
	var tc TraceContext
	for tc.SpanID == [8]byte{} {
		binary.BigEndian.PutUint64(tc.SpanID[:], rand.Uint64())
	}
	if hasParent {
		tc.TraceID = parent.TraceID
		tc.Flags = parent.Flags & FlagSampled
		return tc
	}
	for tc.TraceID == [16]byte{} {
		binary.BigEndian.PutUint64(tc.TraceID[:8], rand.Uint64())
		binary.BigEndian.PutUint64(tc.TraceID[8:], rand.Uint64())
	}
	if sampler.Sample(tc.TraceID) {
		tc.Flags = FlagSampled
	}
	return tc
}

// Sampler decides whether a new trace is sampled, from its trace id alone, as OpenTelemetry's
// TraceIDRatioBased does: so every service with the same ratio makes the same choice for a trace. The
// zero Sampler samples nothing.
type Sampler struct {
	all   bool
	bound uint64 // sampled when the trace id's last 8 bytes, shifted right by one, are below it
}

// NewSampler returns a Sampler keeping the fraction ratio of new traces: ratio >= 1 keeps all, ratio <= 0
// none.
func NewSampler(ratio float64) Sampler {
	if ratio >= 1 {
		return Sampler{all: true}
	}
	if !(ratio > 0) {
		return Sampler{}
	}
	return Sampler{bound: uint64(ratio * (1 << 63))}
}

// Sample reports whether a new trace with this id is sampled.
func (s Sampler) Sample(traceID [16]byte) bool {
	return s.all || binary.BigEndian.Uint64(traceID[8:])>>1 < s.bound
}

const hexDigits = "0123456789abcdef"

// encodeHex writes src as lowercase hex into dst (len(dst) == 2*len(src)).
func encodeHex(dst, src []byte) {
	for i, c := range src {
		dst[2*i], dst[2*i+1] = hexDigits[c>>4], hexDigits[c&15]
	}
}

// decodeHex decodes lowercase hex src into dst (len(src) == 2*len(dst)).
func decodeHex(dst, src []byte) bool {
	bad := byte(0)
	for i := range dst {
		h, l := hexValue[src[2*i]], hexValue[src[2*i+1]]
		bad |= h | l
		dst[i] = h<<4 | l&15
	}
	return bad&0x80 == 0
}

func hexByte(hi, lo byte) (byte, bool) {
	h, l := hexValue[hi], hexValue[lo]
	return h<<4 | l&15, (h|l)&0x80 == 0
}

// hexValue maps a lowercase hex digit to its value and every other byte to 0x80: uppercase is not the
// spec's HEXDIGLC (section 3.2.2). One table lookup per digit, no branch: ParseTraceparent runs on every
// request with a traceparent (BenchmarkParseTraceparent).
var hexValue = func() (t [256]byte) {
	for i := range t {
		t[i] = 0x80
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = byte(c - '0')
	}
	for c := 'a'; c <= 'f'; c++ {
		t[c] = byte(c - 'a' + 10)
	}
	return t
}()
