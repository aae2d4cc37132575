package loadtest

import (
	"container/list"
	"encoding/binary"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// CapacityOracle is the Oracle with a capacity: one prefix cache shared by the whole fleet, of
// capacity blocks (engines × KV blocks per engine), evicting the least recently used block. A
// prompt hits its leading blocks still cached (with the Oracle's rule: at most ⌊(L−1)/B⌋ of
// them), then all its full blocks are cached and become the most recently used, its first block
// last, so that a sequence's tail is evicted before its parents, as in vLLM's free queue.
//
// It is an estimate, not a bound: LRU is not the optimal eviction, and a real fleet also holds
// the blocks of running requests and splits its capacity among engines. What routing can reach
// under cache pressure is usually below it and always below the unlimited Oracle.
//
// It is safe for concurrent use.
type CapacityOracle struct {
	blockSize, capacity int

	mu           sync.Mutex
	lru          *list.List // of uint64 block keys, most recent first
	blocks       map[uint64]*list.Element
	buf          []uint32
	keys         []uint64
	promptTokens int64
	hitTokens    int64
}

// NewCapacityOracle returns an empty capacity-aware oracle for blocks of blockSize tokens and a
// pooled cache of capacity blocks (at least 1).
func NewCapacityOracle(blockSize, capacity int) *CapacityOracle {
	if blockSize <= 0 {
		blockSize = 16
	}
	return &CapacityOracle{blockSize: blockSize, capacity: max(capacity, 1), lru: list.New(), blocks: map[uint64]*list.Element{}}
}

// AddTokens accounts one prompt given as token ids and returns the tokens it hits. tokens is not
// kept.
func (o *CapacityOracle) AddTokens(tokens []uint32) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.add(tokens)
}

// AddMessages accounts one chat prompt, tokenized with the sim's chat template and the
// generation prompt, and returns the tokens it hits.
func (o *CapacityOracle) AddMessages(msgs []Message) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf = appendChatTokens(o.buf[:0], msgs)
	return o.add(o.buf)
}

func (o *CapacityOracle) add(tokens []uint32) int {
	b := o.blockSize
	limit := max((len(tokens)-1)/b, 0)
	// The same chain keys as Oracle.add.
	o.keys = o.keys[:0]
	var parent uint64
	var raw [8]byte
	d := xxhash.New()
	for i := 0; i+b <= len(tokens); i += b {
		d.Reset()
		binary.LittleEndian.PutUint64(raw[:], parent)
		_, _ = d.Write(raw[:])
		for _, t := range tokens[i : i+b] {
			binary.LittleEndian.PutUint32(raw[:4], t)
			_, _ = d.Write(raw[:4])
		}
		parent = d.Sum64()
		o.keys = append(o.keys, parent)
	}
	hit := 0
	for hit < limit && hit < len(o.keys) {
		if _, ok := o.blocks[o.keys[hit]]; !ok {
			break
		}
		hit++
	}
	for i := len(o.keys) - 1; i >= 0; i-- {
		k := o.keys[i]
		if e, ok := o.blocks[k]; ok {
			o.lru.MoveToFront(e)
			continue
		}
		o.blocks[k] = o.lru.PushFront(k)
	}
	for o.lru.Len() > o.capacity {
		e := o.lru.Back()
		delete(o.blocks, e.Value.(uint64))
		o.lru.Remove(e)
	}
	o.promptTokens += int64(len(tokens))
	o.hitTokens += int64(hit * b)
	return hit * b
}

// Totals returns the prompt tokens accounted and the tokens the cache hit.
func (o *CapacityOracle) Totals() (promptTokens, hitTokens int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.promptTokens, o.hitTokens
}

// HitRate returns hit tokens / prompt tokens, or 0 before any prompt.
func (o *CapacityOracle) HitRate() float64 {
	p, h := o.Totals()
	if p == 0 {
		return 0
	}
	return float64(h) / float64(p)
}
