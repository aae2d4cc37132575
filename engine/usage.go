package engine

import (
	"bytes"
	"encoding/binary"
	"math"
	"strconv"
	"sync/atomic"
	"unsafe"
)

// Delivered reuse (docs/architecture.md, "Routing evidence"): what the engine says it served from its
// cache, read from the responses that pass through - usage.prompt_tokens and
// usage.prompt_tokens_details.cached_tokens of a JSON body, or of a stream's usage chunk
// (stream_options.include_usage). The body is not buffered or parsed for it: every chunk the client gets is
// searched for the key "usage" (one bytes.Index per chunk, SIMD-backed), and only the few hundred bytes of
// a usage object are read, in one pass that picks up its three counts and builds nothing (readUsage); they
// are copied first only when the object spans two chunks. (A general JSON parser, fastjson, cost twice the
// time and 5% of the instructions of a whole proxied request: bench/results/instructions.md.)
//
// A key found inside a string cannot fool it: a JSON string holds a quote only as \", so the bytes
// "usage" followed by a colon are always a key. The last usage object of a response wins: engines that
// report usage on every chunk (vLLM's continuous_usage_stats) count up to the final one, and the others
// send "usage":null, which is skipped.

// usageKey is what the scan looks for; a match is followed by optional whitespace, a colon, and the value.
var usageKey = []byte(`"usage"`)

// maxUsageBytes bounds the usage object the scan copies; a longer one is not a usage object it knows and is
// ignored.
const maxUsageBytes = 1024

type usagePhase uint8

const (
	usageSearching usagePhase = iota
	usageColon                // after the key: whitespace, then ':'
	usageValue                // after the colon: whitespace, then '{' (or null: skipped)
	usageObject               // at or inside the object
)

// usageScan follows one response body. The zero value is ready; reset makes it so again.
type usageScan struct {
	phase usagePhase
	// carry holds the last bytes of the previous chunk (fewer than len(usageKey)), for a key that spans two
	// chunks.
	carry  [8]byte
	nCarry int
	// The start of a usage object that did not end in its chunk, copied until it does.
	obj  [maxUsageBytes]byte
	nObj int

	// What was found: the last complete usage object's numbers.
	found     bool // a usage object with prompt_tokens
	hasCached bool // ... and prompt_tokens_details.cached_tokens
	prompt    int64
	cached    int64
	completed int64 // completion_tokens, 0 when absent
}

// usageFigures are the numbers a usage scan found.
type usageFigures struct {
	found, hasCached          bool
	prompt, cached, completed int64
}

// figures returns what the scan found so far.
func (s *usageScan) figures() usageFigures {
	return usageFigures{s.found, s.hasCached, s.prompt, s.cached, s.completed}
}

func (s *usageScan) reset() {
	s.phase, s.nCarry, s.nObj = usageSearching, 0, 0
	s.found, s.hasCached, s.prompt, s.cached, s.completed = false, false, 0, 0, 0
}

// feed scans the next chunk of the body.
func (s *usageScan) feed(b []byte) {
	for len(b) > 0 {
		if s.phase != usageSearching {
			b = s.value(b)
			continue
		}
		carried := s.nCarry
		s.nCarry = 0
		if carried > 0 {
			// A key split between the previous chunk and this one.
			var w [2 * len(`"usage"`)]byte
			n := copy(w[:], s.carry[:carried])
			m := copy(w[n:], b[:min(len(b), len(usageKey)-1)])
			if i := bytes.Index(w[:n+m], usageKey); i >= 0 && i < n {
				s.phase = usageColon
				b = b[i+len(usageKey)-n:]
				continue
			}
		}
		i := bytes.Index(b, usageKey)
		if i < 0 {
			s.nCarry = carried // the bytes before b, still adjacent to it
			s.keepCarry(b)
			return
		}
		s.phase = usageColon
		b = b[i+len(usageKey):]
	}
}

// keepCarry keeps the last len(usageKey)-1 bytes seen, this chunk's and (when it is shorter) the previous
// carry's.
func (s *usageScan) keepCarry(b []byte) {
	const keep = len(`"usage"`) - 1
	if len(b) >= keep {
		s.nCarry = copy(s.carry[:], b[len(b)-keep:])
		return
	}
	if over := s.nCarry + len(b) - keep; over > 0 {
		copy(s.carry[:], s.carry[over:s.nCarry])
		s.nCarry -= over
	}
	s.nCarry += copy(s.carry[s.nCarry:], b)
}

// value goes on after a key: it reads the colon and the value, and an object with readUsage - where it lies
// when it ends in this chunk (the usual case), else copied until it ends. It returns what is left of b.
func (s *usageScan) value(b []byte) []byte {
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch s.phase {
		case usageColon, usageValue:
			switch {
			case c == ' ' || c == '\t' || c == '\r' || c == '\n':
			case c == ':' && s.phase == usageColon:
				s.phase = usageValue
			case c == '{' && s.phase == usageValue:
				s.phase, s.nObj = usageObject, 0
				i-- // read below
			default:
				// Not a usage object (null, a string value "usage", or not JSON): search again from here.
				s.phase = usageSearching
				return b[i:]
			}
		case usageObject:
			if s.nObj == 0 {
				if end, done := s.readUsage(b[i:]); done {
					s.phase = usageSearching
					return b[i+end:]
				}
			}
			// The object goes on past this chunk: add the chunk to the copy and read the copy again.
			prev := s.nObj
			s.nObj += copy(s.obj[prev:], b[i:])
			end, done := s.readUsage(s.obj[:s.nObj])
			switch {
			case done && end > prev:
				s.phase = usageSearching
				return b[i+end-prev:]
			case done || s.nObj == len(s.obj):
				// Not a usage object, or longer than one: search again from here.
				s.phase = usageSearching
				return b[i:]
			}
			return nil
		}
	}
	return nil
}

// readUsage reads the usage object at the start of b (b[0] is its '{'). It reports done and the object's end
// once the object is whole in b - also when it is not one to count (malformed, too deep, longer than
// maxUsageBytes, without a usable prompt_tokens: ignored) - and false when b ends first. A usable object's
// counts become the scan's.
//
// It reads the object in one pass, without building it: the counts are found at their places
// (prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens) and every other value is skipped,
// validated as JSON. A key written with escapes is not recognised (no engine writes one).
func (s *usageScan) readUsage(b []byte) (end int, done bool) {
	var r usageReader
	r.b = b[:min(len(b), maxUsageBytes)]
	ok := r.object(0)
	if r.short {
		if len(b) > maxUsageBytes {
			return 0, true // longer than a usage object: not one, and the search goes on inside it
		}
		return 0, false
	}
	if ok && r.hasPrompt {
		s.found, s.prompt, s.completed = true, r.prompt, r.completed
		s.cached, s.hasCached = r.cached, r.hasCached && r.cached <= r.prompt
		// An engine that says it served more from cache than the prompt held is not measuring what we count.
	}
	return r.i, true
}

// usageReader walks one usage object. short is set when the bytes end before the object does.
type usageReader struct {
	b     []byte
	i     int
	short bool

	prompt, completed, cached int64
	hasPrompt, hasCached      bool
}

// maxUsageDepth bounds the nesting the reader follows; a deeper object is not a usage object.
const maxUsageDepth = 8

func (r *usageReader) ws() {
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ' ', '\t', '\r', '\n':
			r.i++
		default:
			return
		}
	}
}

// peek returns the next byte after white space, or 0 (and short) at the end of the bytes. The usual next
// byte, not white space, is returned without a call.
func (r *usageReader) peek() byte {
	if r.i < len(r.b) && r.b[r.i] > ' ' {
		return r.b[r.i]
	}
	return r.peekSpace()
}

func (r *usageReader) peekSpace() byte {
	r.ws()
	if r.i >= len(r.b) {
		r.short = true
		return 0
	}
	return r.b[r.i]
}

// object reads an object at r.i. At depth 0 (the usage object) and 1 (prompt_tokens_details) it picks up
// the counts.
func (r *usageReader) object(depth int) bool {
	if r.peek() != '{' || depth > maxUsageDepth {
		return false
	}
	r.i++
	if c := r.peek(); c == '}' {
		r.i++
		return true
	}
	for {
		if r.peek() != '"' {
			return false
		}
		ks := r.i + 1
		if !r.str() {
			return false
		}
		key := r.b[ks : r.i-1]
		if r.peek() != ':' {
			return false
		}
		r.i++
		r.ws()
		var ok bool
		switch {
		case depth == 0 && string(key) == "prompt_tokens":
			r.prompt, r.hasPrompt, ok = r.count()
		case depth == 0 && string(key) == "completion_tokens":
			var has bool
			if r.completed, has, ok = r.count(); !has {
				r.completed = 0
			}
		case depth == 0 && string(key) == "prompt_tokens_details" && r.peek() == '{':
			ok = r.object(1)
		case depth == 1 && string(key) == "cached_tokens":
			r.cached, r.hasCached, ok = r.count()
		default:
			ok = r.value(depth + 1)
		}
		if !ok {
			return false
		}
		switch r.peek() {
		case ',':
			r.i++
		case '}':
			r.i++
			return true
		default:
			return false
		}
	}
}

// value skips any JSON value at r.i.
func (r *usageReader) value(depth int) bool {
	switch c := r.peek(); {
	case c == '{':
		return r.object(max(depth, 2)) // counts are only read at their own places
	case c == '[':
		if depth > maxUsageDepth {
			return false
		}
		r.i++
		if r.peek() == ']' {
			r.i++
			return true
		}
		for {
			if !r.value(depth + 1) {
				return false
			}
			switch r.peek() {
			case ',':
				r.i++
			case ']':
				r.i++
				return true
			default:
				return false
			}
		}
	case c == '"':
		return r.str()
	case c == '-' || ('0' <= c && c <= '9'):
		_, ok := r.number()
		return ok
	case c == 't':
		return r.literal("true")
	case c == 'f':
		return r.literal("false")
	case c == 'n':
		return r.literal("null")
	}
	return false
}

// strPlain marks the bytes a string holds as they are: not a quote, a backslash or a control character.
var strPlain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

const (
	lsb = 0x0101010101010101 // the low bit of each byte of a word
	msb = 0x8080808080808080 // the high bit of each byte of a word
)

// str skips a string at r.i (its opening quote) up to and including its closing quote. Eight plain bytes
// (no quote, backslash or control character) are passed over at a time, the rest one by one.
func (r *usageReader) str() bool {
	b := r.b
	i := r.i + 1
	for ; i+8 <= len(b); i += 8 {
		w := binary.LittleEndian.Uint64(b[i:])
		q, s := w^(lsb*'"'), w^(lsb*'\\')
		// A zero byte in q or s (a quote, a backslash), or a byte of w below 0x20.
		if ((q-lsb)&^q|(s-lsb)&^s|(w-lsb*0x20)&^w)&msb != 0 {
			break
		}
	}
	for ; i < len(b); i++ {
		c := b[i]
		if strPlain[c] {
			continue
		}
		switch c {
		case '"':
			r.i = i + 1
			return true
		case '\\':
			i++ // the escaped byte (a \u's digits are plain bytes)
		default:
			return false // a control character
		}
	}
	r.short = true
	return false
}

func (r *usageReader) literal(word string) bool {
	n := min(len(word), len(r.b)-r.i)
	if string(r.b[r.i:r.i+n]) != word[:n] {
		return false
	}
	if n < len(word) {
		r.short = true
		return false
	}
	r.i += n
	return true
}

// number reads a JSON number at r.i and returns its bytes.
func (r *usageReader) number() ([]byte, bool) {
	b, start := r.b, r.i
	i := start
	if i < len(b) && b[i] == '-' {
		i++
	}
	j := digitsEnd(b, i)
	ok := j > i
	if i = j; ok && i < len(b) && b[i] == '.' {
		j = digitsEnd(b, i+1)
		ok, i = j > i+1, j
	}
	if ok && i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j = digitsEnd(b, i)
		ok, i = j > i, j
	}
	if i >= len(b) {
		// The number may go on in bytes not yet here.
		r.short = true
		return nil, false
	}
	if !ok {
		return nil, false
	}
	r.i = i
	return b[start:i], true
}

// digitsEnd returns the index of the first byte at or after i in b that is not a decimal digit.
func digitsEnd(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}

// count reads a token count: a non-negative integer (12 or 12.0 or 1.2e1) no larger than 2^53. A value of
// another kind is read past and reported absent (has false); ok is false only for malformed JSON.
func (r *usageReader) count() (n int64, has, ok bool) {
	c := r.peek()
	if c != '-' && (c < '0' || c > '9') {
		return 0, false, r.value(2)
	}
	num, ok := r.number()
	if !ok {
		return 0, false, false
	}
	plain := true
	for _, d := range num {
		if d < '0' || d > '9' {
			plain = false
			break
		}
	}
	if plain && len(num) <= 15 { // below 2^53 without overflow
		for _, d := range num {
			n = n*10 + int64(d-'0')
		}
		return n, true, true
	}
	f, err := strconv.ParseFloat(unsafe.String(&num[0], len(num)), 64)
	if err != nil || f < 0 || f != math.Trunc(f) || f > 1<<53 {
		return 0, false, true
	}
	return int64(f), true, true
}

// ewma is an exponentially weighted moving average updated without a lock; NaN until the first sample.
// samples counts the samples since the last restart (the stale loop's window, lifecycle.go).
type ewma struct {
	bits    atomic.Uint64
	samples atomic.Int64
}

// restart forgets the average; it reports whether this call did it (of concurrent callers, one does).
func (e *ewma) restart() bool {
	old := e.bits.Load()
	if math.IsNaN(math.Float64frombits(old)) || !e.bits.CompareAndSwap(old, math.Float64bits(math.NaN())) {
		return false
	}
	e.samples.Store(0)
	return true
}

// gapAlpha weighs each new sample of the reuse gap: about the last 20 measured requests count.
const gapAlpha = 0.05

func newEWMA() *ewma {
	e := &ewma{}
	e.bits.Store(math.Float64bits(math.NaN()))
	return e
}

// add takes a sample. The first samples are averaged plainly (weight 1/n) until 1/n falls to gapAlpha, so a
// fresh average is not dominated by its first sample.
func (e *ewma) add(x float64) {
	a := max(gapAlpha, 1/float64(e.samples.Add(1)))
	for {
		old := e.bits.Load()
		v := math.Float64frombits(old)
		nv := x
		if !math.IsNaN(v) {
			nv = v + a*(x-v)
		}
		if e.bits.CompareAndSwap(old, math.Float64bits(nv)) {
			return
		}
	}
}

func (e *ewma) value() float64 { return math.Float64frombits(e.bits.Load()) }
