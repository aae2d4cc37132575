package sim

// The block prefix cache, modelled on vLLM's BlockPool (vllm/v1/core/block_pool.py):
//   - a block is a full block of BlockSize prompt tokens named by its chained hash;
//   - a request pins (references) the cached blocks it uses and owns "private" blocks for the
//     rest of its prompt and its output;
//   - after prefill the request's new full blocks become cached (BlockStored);
//   - a cached block nobody references sits in an LRU list and is evicted (BlockRemoved) when a
//     request needs room; a request frees its blocks tail first, so a sequence's last block is
//     evicted before its parents, as vLLM's free queue does.
// One entry per hash: a request that computes a block another request cached meanwhile adopts
// the cached one and gives its private copy back (vLLM may keep both and send the hash twice).
//
// Not safe for concurrent use: the engine calls it under its mutex.

type block struct {
	id         uint32 // the block's number in the pool, as remote_block_ids name it; kept across reuse
	hash       blockHash
	ref        int32
	cached     bool   // in prefixCache.blocks; false after a restart dropped it while pinned
	prev, next *block // LRU links while ref == 0 && cached
}

type prefixCache struct {
	numBlocks int
	blockSize int
	free      int // blocks neither cached nor held by a request

	blocks map[blockHash]*block
	// LRU of cached blocks with ref == 0: head is evicted first.
	lruHead, lruTail *block
	lruLen           int
	spare            []*block
	nextID           uint32

	log *eventLog // nil when KV events are off

	evictions uint64
}

func newPrefixCache(numBlocks, blockSize int, log *eventLog) *prefixCache {
	return &prefixCache{
		numBlocks: numBlocks,
		blockSize: blockSize,
		free:      numBlocks,
		blocks:    make(map[blockHash]*block),
		log:       log,
	}
}

// match returns how many leading hashes are cached, at most limit.
func (c *prefixCache) match(hashes []blockHash, limit int) int {
	n := 0
	for n < limit && n < len(hashes) {
		if _, ok := c.blocks[hashes[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// fits reports whether need private blocks can be allocated after pinning hashes[:hit].
func (c *prefixCache) fits(hashes []blockHash, hit, need int) bool {
	evictable := c.lruLen
	for i := 0; i < hit; i++ {
		if c.blocks[hashes[i]].ref == 0 {
			evictable-- // pinned by this request, so no longer evictable
		}
	}
	return c.free+evictable >= need
}

// pin references hashes[:hit] (all cached) and appends their blocks to held.
func (c *prefixCache) pin(held []*block, hashes []blockHash) []*block {
	for i := range hashes {
		b := c.blocks[hashes[i]]
		c.ref(b)
		held = append(held, b)
	}
	return held
}

func (c *prefixCache) ref(b *block) {
	if b.ref == 0 {
		c.lruRemove(b)
	}
	b.ref++
}

// allocate takes n private blocks, evicting least recently used cached blocks as needed.
// The caller checked fits.
func (c *prefixCache) allocate(n int) {
	for c.free < n {
		b := c.lruHead
		if b == nil {
			panic("BUG: sim cache allocates more blocks than it has")
		}
		c.lruRemove(b)
		delete(c.blocks, b.hash)
		c.evictions++
		if c.log != nil {
			// vLLM sends one BlockRemoved per evicted block (block_pool.py _maybe_evict_cached_block).
			c.log.removed(b.hash)
		}
		c.recycle(b)
		c.free++
	}
	c.free -= n
}

// store caches hashes (the request's full blocks from index first on, computed by prefill) and
// appends their blocks to held. Each block stored turns one of the request's private blocks
// into a cached one; a hash already cached is adopted and its private block freed. It returns
// held and the number of private blocks used up. tokens are the request's prompt tokens, lora
// its adapter (nil for the base model), named in the BlockStored events.
func (c *prefixCache) store(held []*block, hashes []blockHash, first int, tokens []uint32, lora *loraAdapter) ([]*block, int) {
	used := 0
	runStart := -1
	flush := func(end int) {
		if runStart < 0 || c.log == nil {
			runStart = -1
			return
		}
		ev := storedEvent{
			hashes:    hashes[runStart:end],
			tokens:    tokens[runStart*c.blockSize : end*c.blockSize],
			blockSize: c.blockSize,
		}
		if lora != nil {
			ev.loraID, ev.loraName = lora.id, lora.name
		}
		if runStart > 0 {
			ev.parent = &hashes[runStart-1]
		}
		c.log.stored(&ev)
		runStart = -1
	}
	for i := first; i < len(hashes); i++ {
		used++
		if b, ok := c.blocks[hashes[i]]; ok {
			flush(i)
			c.ref(b)
			held = append(held, b)
			c.free++
			continue
		}
		b := c.newBlock()
		b.hash = hashes[i]
		b.ref = 1
		b.cached = true
		c.blocks[b.hash] = b
		held = append(held, b)
		if runStart < 0 {
			runStart = i
		}
	}
	flush(len(hashes))
	return held, used
}

// release drops the request's references, last block first, and frees private blocks.
func (c *prefixCache) release(held []*block, private int) {
	for i := len(held) - 1; i >= 0; i-- {
		b := held[i]
		held[i] = nil
		b.ref--
		if b.ref > 0 {
			continue
		}
		if b.cached {
			c.lruPush(b)
		} else {
			c.recycle(b)
			c.free++
		}
	}
	c.free += private
}

// clear drops every cached block, as a restart or reset_prefix_cache does. Pinned blocks stay
// with their requests as uncached blocks and are freed on release.
func (c *prefixCache) clear() {
	for h, b := range c.blocks {
		delete(c.blocks, h)
		b.cached = false
		if b.ref == 0 {
			c.lruRemove(b)
			c.recycle(b)
			c.free++
		}
	}
}

// cachedBlocks returns the number of cached blocks.
func (c *prefixCache) cachedBlocks() int { return len(c.blocks) }

// usedBlocks returns the blocks held by requests: vLLM's usage counts cached blocks nobody
// holds as free (they are in the free queue).
func (c *prefixCache) usedBlocks() int { return c.numBlocks - c.free - c.lruLen }

func (c *prefixCache) newBlock() *block {
	if n := len(c.spare); n > 0 {
		b := c.spare[n-1]
		c.spare = c.spare[:n-1]
		return b
	}
	b := &block{id: c.nextID}
	c.nextID++
	return b
}

func (c *prefixCache) recycle(b *block) {
	*b = block{id: b.id}
	c.spare = append(c.spare, b)
}

func (c *prefixCache) lruPush(b *block) {
	b.prev = c.lruTail
	b.next = nil
	if c.lruTail != nil {
		c.lruTail.next = b
	} else {
		c.lruHead = b
	}
	c.lruTail = b
	c.lruLen++
}

func (c *prefixCache) lruRemove(b *block) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		c.lruHead = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		c.lruTail = b.prev
	}
	b.prev, b.next = nil, nil
	c.lruLen--
}
