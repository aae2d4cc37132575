package pressure

import (
	"encoding/binary"
	"math"

	"github.com/cespare/xxhash/v2"
)

// PlacementOracle is the capacity-aware reference of the KV-pressure report: an offline router with
// perfect knowledge of every engine's cache, run over the prompts in the order they were sent. Each engine
// is modelled as the sim's prefix cache of capacity blocks: one LRU list of full blocks (named by chained
// hashes), a request hitting the leading blocks its engine still holds (at most ⌊(L−1)/B⌋, the engine's
// rule), then making all its full blocks the most recently used, its first block last, so a sequence's
// tail is evicted before its parents (sim/cache.go, vLLM's free queue).
//
// The placement is greedy: each request goes to the engine whose cache holds its longest prefix, among the
// engines below a bounded load - fewer than ⌈(1 + Epsilon) × (i + 1) / N⌉ of the first i + 1 requests, the
// consistent-hashing-with-bounded-loads cap - with ties to the engine with fewer requests, then the lower
// index. Without the cap the greedy would pile every request sharing one hot prefix on one engine, which
// the report's balance goals forbid.
//
// It is a reference, not a bound: greedy is not optimal placement, LRU is not optimal eviction, and it
// ignores time (the blocks running requests pin, which shrink a real engine's cache, and requests that
// overlap and so cannot hit each other). A live strategy can come out above it. It never exceeds the
// infinite-cache bound (a block it hits was computed by an earlier request).
//
// Not safe for concurrent use.
type PlacementOracle struct {
	blockSize int
	epsilon   float64
	engines   []*blockLRU
	requests  []int
	prefill   []int64

	promptTokens, hitTokens int64
	n                       int
	keys                    []uint64
}

// NewPlacementOracle returns the oracle of engines engines of capacity blocks each, blocks of blockSize
// tokens, and load cap epsilon.
func NewPlacementOracle(engines, capacity, blockSize int, epsilon float64) *PlacementOracle {
	o := &PlacementOracle{blockSize: max(blockSize, 1), epsilon: epsilon, requests: make([]int, engines), prefill: make([]int64, engines)}
	for range engines {
		o.engines = append(o.engines, newBlockLRU(max(capacity, 1)))
	}
	return o
}

// Add places one prompt (token ids, not kept) and returns the engine chosen and the tokens it hits.
func (o *PlacementOracle) Add(tokens []uint32) (engine, hit int) {
	limit := o.prepare(tokens)
	capReq := int(math.Ceil((1 + o.epsilon) * float64(o.n+1) / float64(len(o.engines))))
	best, bestHit := -1, -1
	for e, c := range o.engines {
		if o.requests[e] >= capReq {
			continue
		}
		h := c.match(o.keys[:limit])
		if h > bestHit || h == bestHit && o.requests[e] < o.requests[best] {
			best, bestHit = e, h
		}
	}
	return best, o.place(best, bestHit, len(tokens))
}

// AddTo sends one prompt to engine (a placement decided elsewhere, e.g. round robin) and returns the
// tokens it hits.
func (o *PlacementOracle) AddTo(engine int, tokens []uint32) int {
	limit := o.prepare(tokens)
	return o.place(engine, o.engines[engine].match(o.keys[:limit]), len(tokens))
}

// prepare computes the keys of tokens and returns how many leading blocks may hit.
func (o *PlacementOracle) prepare(tokens []uint32) int {
	o.keys = chainKeys(o.keys[:0], tokens, o.blockSize)
	return min(max((len(tokens)-1)/o.blockSize, 0), len(o.keys))
}

// place accounts a prompt of n tokens hitting hitBlocks on engine e and caches its blocks there.
func (o *PlacementOracle) place(e, hitBlocks, n int) int {
	o.engines[e].touch(o.keys)
	o.requests[e]++
	o.n++
	hit := hitBlocks * o.blockSize
	o.prefill[e] += int64(n - hit)
	o.promptTokens += int64(n)
	o.hitTokens += int64(hit)
	return hit
}

// HitRate returns hit tokens / prompt tokens, or 0 before any prompt.
func (o *PlacementOracle) HitRate() float64 {
	if o.promptTokens == 0 {
		return 0
	}
	return float64(o.hitTokens) / float64(o.promptTokens)
}

// Requests returns the requests placed per engine; the slice is the oracle's, valid until the next Add.
func (o *PlacementOracle) Requests() []int { return o.requests }

// chainKeys appends the chained hash of each full block of tokens to dst: a block's key covers its tokens
// and the key before it, so a block is the same block only after the same prefix (as the engine's hashes).
func chainKeys(dst []uint64, tokens []uint32, blockSize int) []uint64 {
	var parent uint64
	var raw [8]byte
	d := xxhash.New()
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		d.Reset()
		binary.LittleEndian.PutUint64(raw[:], parent)
		_, _ = d.Write(raw[:])
		for _, t := range tokens[i : i+blockSize] {
			binary.LittleEndian.PutUint32(raw[:4], t)
			_, _ = d.Write(raw[:4])
		}
		parent = d.Sum64()
		dst = append(dst, parent)
	}
	return dst
}

// blockLRU is one engine's cached blocks, least recently used evicted first. Nodes live in one slice
// linked by index (0 is the sentinel), so a long run does not allocate per block.
type blockLRU struct {
	capacity int
	index    map[uint64]int32
	nodes    []lruNode
	free     []int32
}

type lruNode struct {
	key        uint64
	prev, next int32
}

func newBlockLRU(capacity int) *blockLRU {
	return &blockLRU{capacity: capacity, index: make(map[uint64]int32, capacity), nodes: []lruNode{{}}}
}

// match returns how many leading keys are cached.
func (c *blockLRU) match(keys []uint64) int {
	n := 0
	for n < len(keys) {
		if _, ok := c.index[keys[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// touch makes keys the most recently used, keys[0] the most recent of all, inserting those not cached,
// then evicts down to capacity.
func (c *blockLRU) touch(keys []uint64) {
	for i := len(keys) - 1; i >= 0; i-- {
		k := keys[i]
		if j, ok := c.index[k]; ok {
			c.unlink(j)
			c.pushFront(j)
			continue
		}
		var j int32
		if n := len(c.free); n > 0 {
			j, c.free = c.free[n-1], c.free[:n-1]
		} else {
			c.nodes = append(c.nodes, lruNode{})
			j = int32(len(c.nodes) - 1)
		}
		c.nodes[j].key = k
		c.index[k] = j
		c.pushFront(j)
	}
	for len(c.index) > c.capacity {
		j := c.nodes[0].prev // the least recently used
		c.unlink(j)
		delete(c.index, c.nodes[j].key)
		c.free = append(c.free, j)
	}
}

func (c *blockLRU) unlink(j int32) {
	n := &c.nodes[j]
	c.nodes[n.prev].next = n.next
	c.nodes[n.next].prev = n.prev
}

func (c *blockLRU) pushFront(j int32) {
	head := c.nodes[0].next
	c.nodes[j].prev, c.nodes[j].next = 0, head
	c.nodes[head].prev = j
	c.nodes[0].next = j
}
