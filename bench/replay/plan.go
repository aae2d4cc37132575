package replay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/rolter-ai/rolter/capture"
	"github.com/rolter-ai/rolter/loadtest"
)

// A replay turns a trace into requests whose prompts share exactly what the trace's prompts
// shared: every distinct block (its hash after the hashes before it) becomes a distinct
// deterministic chunk of synthetic text of the block's size in tokens, so two requests whose
// first k blocks are equal get prompts with the same first k chunks, and differ from the next
// token on. Chunks are made of the three-letter words of loadtest's workloads, each with its
// leading space exactly one token of the sim's tokenizer (sim.AppendTokens), so sizes are exact.

// TemplateTokens is what the sim's chat template adds to a prompt sent as one user message:
// <im_start> "user" <role_end> … <im_end> (4) and the generation prompt <im_start> "assi" "stan"
// "t" <role_end> (5).
const TemplateTokens = 9

// Scenario is the scenario name of a replayed trace's plan.
const Scenario = "replay"

// DefaultBytesPerToken converts a capture's block bytes to tokens when no line of it carries
// usage ("in"): about 4 bytes per token of English text.
const DefaultBytesPerToken = 4.0

// DefaultOutputTokens is max_tokens of a request whose output length the trace does not
// know (the sim's default).
const DefaultOutputTokens = 16

// PlanOptions shape TracePlan. Zero values take the defaults named.
type PlanOptions struct {
	// Scale divides every token count: block sizes, prompt and output lengths (1). Prefix sharing
	// is kept exactly; only the sizes shrink.
	Scale int
	// Speed > 0 makes the plan Timed: request i is sent at its trace time ÷ Speed. 0 sends the
	// requests in trace order as fast as the closed loop goes.
	Speed float64
	// MaxModelLen skips requests whose replayed prompt plus output tokens exceed it (the engines'
	// max_model_len, KV blocks × block size; 0: no limit).
	MaxModelLen int
	// MaxRequests is the most requests planned (0: all).
	MaxRequests int
	// BytesPerToken converts a capture's bytes to tokens when no line carries "in"
	// (DefaultBytesPerToken).
	BytesPerToken float64
	// IncludeUnanswered replays capture lines whose client got no 2xx (skipped by default: they
	// may never have reached an engine).
	IncludeUnanswered bool
	// NoContinuation keeps every partial last block distinct. By default the partial last block
	// of a session's request, when the session's next request has the same blocks before it and
	// a different block in its place, is replayed as the start of that block: in a conversation
	// each turn's prompt is a prefix of the next one, which the capture cannot show for a block
	// cut short (its hash covers fewer bytes). Without it a multi-turn replay loses about half a
	// block per turn of the reuse the live run had.
	NoContinuation bool
}

// PlanStats describe what TracePlan made of a trace.
type PlanStats struct {
	// Read is the number of requests in the trace; Planned the number in the plan.
	Read    int `json:"read"`
	Planned int `json:"planned"`
	// Skipped counts the requests left out, by reason.
	Skipped map[string]int `json:"skipped,omitempty"`
	// Sessions is the number of distinct sessions among the planned requests.
	Sessions int `json:"sessions"`
	// Blocks is the number of distinct blocks (a hash after the hashes before it) planned.
	Blocks int `json:"distinct_blocks"`
	// Continued is the number of partial last blocks replayed as the start of their session's
	// next block (PlanOptions.NoContinuation).
	Continued int `json:"continued_blocks"`
	// BlockTokens is the mean size in tokens of a full block of the replay (block i of a prompt
	// has round((i+1)×BlockTokens) − round(i×BlockTokens) tokens, at least 1).
	BlockTokens float64 `json:"block_tokens"`
	// TokensPerByte is the conversion of a capture's bytes (0 for a trace in tokens).
	TokensPerByte float64 `json:"tokens_per_byte,omitempty"`
	// PromptTokens and OutputTokens are the planned totals (prompt tokens with the template).
	PromptTokens int64 `json:"prompt_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// Span is the time between the first and the last planned request in the trace.
	SpanSeconds float64 `json:"span_seconds"`
	// Live is the hit rate the capture itself recorded over the planned requests that carry both
	// "in" and "cached" (delivered by the engines in the live run), with their number; -1 when
	// none does.
	LiveHitRate  float64 `json:"live_hit_rate"`
	LiveRequests int     `json:"live_requests"`
}

// Skip reasons of PlanStats.Skipped.
const (
	SkipUnanswered = "not answered live (status not 2xx)"
	SkipTooLong    = "prompt + output longer than an engine's max_model_len (KV blocks × block size)"
	SkipOverMax    = "over the request limit"
)

// TracePlan turns a trace into an explicit loadtest plan (see the comment above): one user
// message per request with the synthetic prompt, max_tokens from the trace's output length,
// x-session-id and a dependency on the session's previous request for captured sessions, and
// send times when o.Speed > 0. The same trace and options always give the same plan.
//
// Sizes in tokens: a Mooncake block is 512 tokens and a request's last block is trimmed to its
// input_length; a capture's full block is block_bytes × tokens-per-byte, the ratio of Σ "in" to
// Σ "in_bytes" over the lines that have "in" (else 1 / BytesPerToken), rounded per position so
// that k blocks make round(k × that) tokens (a block's size depends only on its position, which
// its chained identity fixes), and a request with "in" gets in − TemplateTokens content
// tokens (its last, partial block takes the rest), so its replayed prompt_tokens equals the live
// one. Prompt text the trace's blocks do not cover is unique to its request.
func TracePlan(tr *capture.Trace, o PlanOptions) (*loadtest.Plan, PlanStats, error) {
	if o.Scale <= 0 {
		o.Scale = 1
	}
	if o.BytesPerToken <= 0 {
		o.BytesPerToken = DefaultBytesPerToken
	}
	st := PlanStats{Read: len(tr.Requests), Skipped: map[string]int{}, LiveHitRate: -1}
	if !(o.Speed >= 0) || math.IsInf(o.Speed, 0) {
		return nil, st, fmt.Errorf("cannot plan the replay: speed %v must be a number >= 0", o.Speed)
	}
	if len(tr.Requests) == 0 {
		return nil, st, errors.New("cannot plan the replay: the trace has no request")
	}
	sz := newSizer(tr, o)
	st.BlockTokens, st.TokensPerByte = sz.perBlock(&tr.Requests[0]), sz.tokensPerByte
	plan := &loadtest.Plan{
		Workload: loadtest.Workload{Scenario: Scenario, OutputTokens: DefaultOutputTokens},
		Timed:    o.Speed > 0,
	}
	reqs := selectRequests(tr, o, sz, &st)
	if !o.NoContinuation {
		continueBlocks(reqs, &st)
	}
	writeRequests(plan, reqs, o, sz, &st)
	st.Planned = len(plan.Requests)
	if len(st.Skipped) == 0 {
		st.Skipped = nil
	}
	if len(plan.Requests) == 0 {
		return nil, st, fmt.Errorf("cannot plan the replay: every one of the %d requests was skipped (%v)", st.Read, st.Skipped)
	}
	return plan, st, nil
}

// planned is a request of the trace TracePlan replays: its segments, and the session's previous planned
// request (-1 for none).
type planned struct {
	r    *capture.Request
	segs []segment
	prev int
}

// selectRequests is TracePlan's first pass: which requests are replayed (counting the others in
// st.Skipped by reason), with their segments and their sessions' previous requests.
func selectRequests(tr *capture.Trace, o PlanOptions, sz *sizer, st *PlanStats) []planned {
	var reqs []planned
	lastOfSession := map[string]int{}
	for i := range tr.Requests {
		r := &tr.Requests[i]
		if !o.IncludeUnanswered && !r.Answered() {
			st.Skipped[SkipUnanswered]++
			continue
		}
		if o.MaxRequests > 0 && len(reqs) == o.MaxRequests {
			st.Skipped[SkipOverMax]++
			continue
		}
		segs := sz.segments(nil, r)
		if o.MaxModelLen > 0 && contentTokens(segs)+TemplateTokens+sz.output(r) > o.MaxModelLen {
			st.Skipped[SkipTooLong]++
			continue
		}
		p := planned{r: r, segs: segs, prev: -1}
		if r.Session != "" {
			if prev, ok := lastOfSession[r.Session]; ok {
				p.prev = prev
			}
			lastOfSession[r.Session] = len(reqs)
		}
		reqs = append(reqs, p)
	}
	return reqs
}

// contentTokens is the tokens of a prompt's segments, the chat template left out.
func contentTokens(segs []segment) int {
	n := 0
	for _, s := range segs {
		n += s.tokens
	}
	return n
}

// continueBlocks is TracePlan's second pass: a session's partial last block continues into its next
// request (see PlanOptions.NoContinuation). Last to first, so a request's own block is final when the
// request before it takes it.
func continueBlocks(reqs []planned, st *PlanStats) {
	for j := len(reqs) - 1; j >= 0; j-- {
		if reqs[j].prev < 0 {
			continue
		}
		p, next := &reqs[reqs[j].prev], &reqs[j]
		k := len(p.r.Blocks) - 1
		if k < 0 || !p.segs[k].partial || len(next.r.Blocks) <= k || next.segs[k].tail {
			continue
		}
		if next.r.Blocks[k] == p.r.Blocks[k] || !slices.Equal(next.r.Blocks[:k], p.r.Blocks[:k]) {
			continue
		}
		p.segs[k].hash = next.segs[k].hash
		st.Continued++
	}
}

// writeRequests is TracePlan's third pass: the text of every planned request, in order, into plan, and
// the totals into st.
func writeRequests(plan *loadtest.Plan, reqs []planned, o PlanOptions, sz *sizer, st *PlanStats) {
	ch := newChunker()
	sessionGroup := map[string]int{}
	var first, last float64
	var liveIn, liveCached int64
	var text []byte
	for i := range reqs {
		r, segs := reqs[i].r, reqs[i].segs
		out := sz.output(r)
		text = ch.appendText(text[:0], segs, i)
		req := loadtest.Request{
			Group:     -1,
			Messages:  []loadtest.Message{{Role: "user", Content: string(text)}},
			MaxTokens: out,
			Session:   r.Session,
			After:     reqs[i].prev + 1,
		}
		if r.Session != "" {
			g, ok := sessionGroup[r.Session]
			if !ok {
				g = len(sessionGroup)
				sessionGroup[r.Session] = g
			}
			req.Group = g
		}
		if i == 0 {
			first = r.Time
		}
		last = r.Time
		if plan.Timed {
			req.At = time.Duration((r.Time - first) / o.Speed * float64(time.Second))
		}
		if r.Cached >= 0 && r.InTokens > 0 {
			liveIn += int64(r.InTokens)
			liveCached += int64(r.Cached)
			st.LiveRequests++
		}
		st.PromptTokens += int64(contentTokens(segs) + TemplateTokens)
		st.OutputTokens += int64(out)
		plan.Requests = append(plan.Requests, req)
	}
	st.Sessions = len(sessionGroup)
	st.Blocks = ch.blocks
	st.SpanSeconds = last - first
	if liveIn > 0 {
		st.LiveHitRate = float64(liveCached) / float64(liveIn)
	}
}

// segment is one part of a prompt: a block of the trace (hash, the hashes before it implied by
// the order) or a tail no other request shares.
type segment struct {
	hash    uint64
	tokens  int
	tail    bool // past the blocks
	partial bool // the last block, shorter than the others
}

// sizer gives the sizes in tokens of a trace's blocks.
type sizer struct {
	unit          string
	scale         float64
	tokensPerByte float64 // UnitBytes only
}

func newSizer(tr *capture.Trace, o PlanOptions) *sizer {
	s := &sizer{unit: tr.Unit, scale: float64(o.Scale)}
	if tr.Unit == capture.UnitTokens {
		return s
	}
	var in, bytes int64
	for i := range tr.Requests {
		if r := &tr.Requests[i]; r.InTokens > 0 && r.Len > 0 {
			in += int64(r.InTokens)
			bytes += int64(r.Len)
		}
	}
	s.tokensPerByte = 1 / o.BytesPerToken
	if bytes > 0 {
		s.tokensPerByte = float64(in) / float64(bytes)
	}
	return s
}

// perBlock returns the mean tokens of one of r's full blocks.
func (s *sizer) perBlock(r *capture.Request) float64 {
	if s.unit == capture.UnitTokens {
		return float64(r.BlockLen) / s.scale
	}
	return float64(r.BlockLen) * s.tokensPerByte / s.scale
}

// full returns the tokens of r's block i when full.
func (s *sizer) full(r *capture.Request, i int) int {
	b := s.perBlock(r)
	return max(1, int(math.Round(float64(i+1)*b))-int(math.Round(float64(i)*b)))
}

// tokens converts a length in the trace's unit to tokens of the replay (at least 1).
func (s *sizer) tokens(n int) int {
	if s.unit == capture.UnitTokens {
		return max(1, int(math.Ceil(float64(n)/s.scale)))
	}
	return max(1, int(math.Round(float64(n)*s.tokensPerByte/s.scale)))
}

// output returns max_tokens of r.
func (s *sizer) output(r *capture.Request) int {
	if r.OutTokens <= 0 {
		return DefaultOutputTokens
	}
	return max(1, int(math.Round(float64(r.OutTokens)/s.scale)))
}

// segments appends r's prompt as segments to dst. Full blocks get their full size; the last
// block when partial and the uncovered tail are sized so that the content has the prompt's
// length: input_length (Mooncake), in − TemplateTokens when the capture has "in", else the
// bytes converted.
func (s *sizer) segments(dst []segment, r *capture.Request) []segment {
	total := -1 // content tokens, when the trace says
	switch {
	case s.unit == capture.UnitTokens:
		total = s.tokens(r.Len)
	case r.InTokens > 0:
		total = max(1, int(math.Round(float64(r.InTokens)/s.scale))-TemplateTokens)
	}
	used := 0
	for i, h := range r.Blocks {
		n := s.full(r, i)
		start, end := i*r.BlockLen, min((i+1)*r.BlockLen, r.Len)
		if end-start < r.BlockLen { // the last block, partial
			full := n
			if total >= 0 {
				n = total - used
			} else {
				n = s.tokens(end - start)
			}
			if s.unit == capture.UnitTokens {
				n = min(n, full) // trimmed, never grown
			}
			n = max(n, 1)
		}
		dst = append(dst, segment{hash: h, tokens: n, partial: end-start < r.BlockLen})
		used += n
	}
	if covered := r.Covered(); covered < r.Len || len(r.Blocks) == 0 {
		n := 0
		if total >= 0 {
			n = total - used
		} else {
			n = s.tokens(r.Len - covered)
		}
		if n > 0 || len(dst) == 0 {
			dst = append(dst, segment{tokens: max(n, 1), tail: true})
		}
	}
	return dst
}

// chunker names the distinct blocks of a trace and writes their text. Each block key (its hash
// after its parent's key) gets the next sibling number of its parent; a chunk's first word
// spells that number (its second word the number ÷ 17,576), so the chunks after one parent
// differ from their first token on. The other words are drawn from a generator seeded with the
// key, so a chunk's text is a function of the block alone and a shorter chunk of the same block
// (a trimmed last block) is a prefix of a longer one. Not safe for concurrent use.
type chunker struct {
	sibling  map[uint64]uint32 // block key -> its number among its parent's children
	children map[uint64]uint32 // parent key -> children so far
	blocks   int               // distinct trace blocks named
}

func newChunker() *chunker {
	return &chunker{sibling: map[uint64]uint32{}, children: map[uint64]uint32{}}
}

// rootKey is the parent key of a prompt's first block.
const rootKey = 0x9e3779b97f4a7c15

// key returns the key of a child of parent: the block hash h, or for a tail the request number.
func childKey(parent, h uint64, tail bool) uint64 {
	var b [17]byte
	binary.LittleEndian.PutUint64(b[:8], parent)
	binary.LittleEndian.PutUint64(b[8:16], h)
	if tail {
		b[16] = 1
	}
	return xxhash.Sum64(b[:])
}

// appendText appends the prompt of segs to dst; request is the request's number in the plan
// (tails are unique to it).
func (c *chunker) appendText(dst []byte, segs []segment, request int) []byte {
	parent := uint64(rootKey)
	for _, s := range segs {
		h := s.hash
		if s.tail {
			h = uint64(request)
		}
		k := childKey(parent, h, s.tail)
		sib, ok := c.sibling[k]
		if !ok {
			sib = c.children[parent]
			c.children[parent]++
			c.sibling[k] = sib
			if !s.tail {
				c.blocks++
			}
		}
		dst = appendChunk(dst, k, sib, s.tokens)
		parent = k
	}
	return dst
}

const wordSpace = 26 * 26 * 26

// appendChunk appends n words (n tokens) of block key k, numbered sib among its siblings.
func appendChunk(dst []byte, k uint64, sib uint32, n int) []byte {
	put := func(v int) {
		dst = append(dst, ' ', byte('a'+v/676), byte('a'+v/26%26), byte('a'+v%26))
	}
	put(int(sib % wordSpace))
	if n > 1 {
		put(int(sib / wordSpace % wordSpace))
	}
	if n > 2 {
		rng := rand.New(rand.NewPCG(k, 0x5eed))
		for range n - 2 {
			put(rng.IntN(wordSpace))
		}
	}
	return dst
}
