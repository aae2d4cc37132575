package loadtest

import (
	"encoding/binary"
	"sync"

	"github.com/cespare/xxhash/v2"

	"github.com/rolter-ai/rolter/sim"
)

// Oracle computes the token hit-rate bound of a request sequence: what one fleet-wide prefix
// cache of unlimited capacity would hit, with the sim's (and vLLM's) block rules. For each
// prompt of L tokens in send order:
//
//	hit(prompt) = B × min(k, ⌊(L−1)/B⌋)
//
// where B is the block size and k the number of leading full blocks of the prompt that an
// earlier prompt already computed (the −1: a prompt always computes its last token); then every
// full block of the prompt counts as computed. The bound is Σ hit / Σ L. No routing can beat
// it: a replica only hits blocks some earlier request computed on it, and generated tokens are
// not cached by the sim. For shared-prefix with uniform popularity it reduces to
//
//	G × (P−1) × B × ⌊C/B⌋ / (G × P × L)
//
// with C the tokens every prompt of a group shares (system tokens + 8 template tokens) and L
// the prompt length (system + question + 14 template tokens), as each group's prefix is
// computed once fleet-wide (for B >= 8; with B = 4 the 4-token template header is a block of
// its own that all groups share).
//
// It is safe for concurrent use.
type Oracle struct {
	blockSize int

	mu           sync.Mutex
	seen         map[uint64]bool // block key -> hit by a later prompt
	buf          []uint32
	promptTokens int64
	hitTokens    int64
}

// NewOracle returns an empty oracle for blocks of blockSize tokens.
func NewOracle(blockSize int) *Oracle {
	if blockSize <= 0 {
		blockSize = 16
	}
	return &Oracle{blockSize: blockSize, seen: map[uint64]bool{}}
}

// AddTokens accounts one prompt given as token ids and returns the tokens it hits. tokens is not
// kept.
func (o *Oracle) AddTokens(tokens []uint32) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.add(tokens)
}

// AddMessages accounts one chat prompt, tokenized with the sim's chat template and the
// generation prompt, and returns the tokens it hits.
func (o *Oracle) AddMessages(msgs []Message) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf = appendChatTokens(o.buf[:0], msgs)
	return o.add(o.buf)
}

func (o *Oracle) add(tokens []uint32) int {
	b := o.blockSize
	limit := (len(tokens) - 1) / b
	if limit < 0 {
		limit = 0
	}
	// Blocks are named by a chain hash (parent key, then the block's tokens), like the sim's
	// and vLLM's, so a block is the same block only after the same prefix.
	var parent uint64
	var raw [8]byte
	d := xxhash.New()
	hit, matching := 0, true
	for i := 0; i+b <= len(tokens); i += b {
		d.Reset()
		binary.LittleEndian.PutUint64(raw[:], parent)
		_, _ = d.Write(raw[:])
		for _, t := range tokens[i : i+b] {
			binary.LittleEndian.PutUint32(raw[:4], t)
			_, _ = d.Write(raw[:4])
		}
		parent = d.Sum64()
		if _, ok := o.seen[parent]; ok && matching && hit < limit {
			hit++
			o.seen[parent] = true
		} else {
			matching = false
			if _, ok := o.seen[parent]; !ok {
				o.seen[parent] = false
			}
		}
	}
	o.promptTokens += int64(len(tokens))
	o.hitTokens += int64(hit * b)
	return hit * b
}

// Totals returns the prompt tokens accounted and the tokens the bound hits.
func (o *Oracle) Totals() (promptTokens, hitTokens int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.promptTokens, o.hitTokens
}

// Blocks returns the number of distinct full blocks computed: the workload's working set.
func (o *Oracle) Blocks() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.seen)
}

// ReusedBlocks returns the number of distinct blocks that some later prompt hit: the part of
// the working set worth caching.
func (o *Oracle) ReusedBlocks() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, hit := range o.seen {
		if hit {
			n++
		}
	}
	return n
}

// HitRate returns hit tokens / prompt tokens, or 0 before any prompt.
func (o *Oracle) HitRate() float64 {
	p, h := o.Totals()
	if p == 0 {
		return 0
	}
	return float64(h) / float64(p)
}

// appendChatTokens tokenizes msgs like the sim's /v1/chat/completions does.
func appendChatTokens(dst []uint32, msgs []Message) []uint32 {
	pairs := make([][2][]byte, len(msgs))
	for i, m := range msgs {
		pairs[i] = [2][]byte{[]byte(m.Role), []byte(m.Content)}
	}
	return sim.AppendChatTokens(dst, pairs, true)
}

// PromptTokens returns the number of tokens the sim counts for msgs (template included).
func PromptTokens(msgs []Message) int {
	return len(appendChatTokens(nil, msgs))
}
