package engine

import (
	"bytes"
	"math"
	"sync/atomic"

	"github.com/valyala/fastjson"
)

// Delivered reuse (docs/architecture.md, "Routing evidence"): what the engine says it served from its
// cache, read from the responses that pass through - usage.prompt_tokens and
// usage.prompt_tokens_details.cached_tokens of a JSON body, or of a stream's usage chunk
// (stream_options.include_usage). The body is not buffered or parsed for it: every chunk the client gets is
// searched for the key "usage" (one bytes.Index per chunk, SIMD-backed), and only the few hundred bytes of
// a usage object are copied and parsed.
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
	usageObject               // inside the object, copying it
)

// usageScan follows one response body. The zero value is ready; reset makes it so again.
type usageScan struct {
	phase usagePhase
	// carry holds the last bytes of the previous chunk (fewer than len(usageKey)), for a key that spans two
	// chunks.
	carry  [8]byte
	nCarry int
	// The usage object being copied: its bytes, nesting depth, and whether the scan is inside a string.
	obj          [maxUsageBytes]byte
	nObj         int
	depth        int
	inStr, escap bool

	// What was found: the last complete usage object's numbers.
	found     bool // a usage object with prompt_tokens
	hasCached bool // ... and prompt_tokens_details.cached_tokens
	prompt    int64
	cached    int64
	completed int64 // completion_tokens, 0 when absent

	p fastjson.Parser
}

func (s *usageScan) reset() {
	s.phase, s.nCarry, s.nObj, s.depth, s.inStr, s.escap = usageSearching, 0, 0, 0, false, false
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

// value goes on after a key: it reads the colon and the value, copies an object, and parses it once it is
// whole. It returns what is left of b.
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
				s.phase, s.nObj, s.depth, s.inStr, s.escap = usageObject, 0, 0, false, false
				i-- // copied below
			default:
				// Not a usage object (null, a string value "usage", or not JSON): search again from here.
				s.phase = usageSearching
				return b[i:]
			}
		case usageObject:
			// Copy up to the closing brace, or give up when the object is too long.
			j := i
			for ; j < len(b); j++ {
				c := b[j]
				switch {
				case s.escap:
					s.escap = false
				case s.inStr:
					if c == '\\' {
						s.escap = true
					} else if c == '"' {
						s.inStr = false
					}
				case c == '"':
					s.inStr = true
				case c == '{' || c == '[':
					s.depth++
				case c == '}' || c == ']':
					s.depth--
				}
				if s.depth == 0 {
					break
				}
			}
			end := j
			if j < len(b) {
				end = j + 1 // the closing brace
			}
			if s.nObj+end-i > len(s.obj) {
				s.phase = usageSearching
				return b[i:]
			}
			s.nObj += copy(s.obj[s.nObj:], b[i:end])
			if j == len(b) {
				return nil // the object goes on in the next chunk
			}
			s.phase = usageSearching
			s.parse(s.obj[:s.nObj])
			return b[end:]
		}
	}
	return nil
}

// parse reads a complete usage object. One without a usable prompt_tokens is ignored.
func (s *usageScan) parse(obj []byte) {
	v, err := s.p.ParseBytes(obj)
	if err != nil {
		return
	}
	prompt, ok := tokenCount(v.Get("prompt_tokens"))
	if !ok {
		return
	}
	s.found, s.prompt = true, prompt
	s.completed, _ = tokenCount(v.Get("completion_tokens"))
	s.cached, s.hasCached = tokenCount(v.Get("prompt_tokens_details", "cached_tokens"))
	if s.cached > s.prompt {
		// An engine that says it served more from cache than the prompt held is not measuring what we count.
		s.hasCached = false
	}
}

// tokenCount reads a non-negative integer token count.
func tokenCount(v *fastjson.Value) (int64, bool) {
	if v == nil || v.Type() != fastjson.TypeNumber {
		return 0, false
	}
	f := v.GetFloat64()
	if f < 0 || f != math.Trunc(f) || f > 1<<53 {
		return 0, false
	}
	return int64(f), true
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
