package sim

import (
	"fmt"
	"testing"
)

func tokensOf(seed uint32, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = seed*1000 + uint32(i)
	}
	return t
}

// takeEvents decodes the events a cache emitted since the last call.
func takeEvents(t *testing.T, log *eventLog) []testEvent {
	t.Helper()
	events, n, _ := log.take(nil)
	if n == 0 {
		return nil
	}
	b, err := decodeBatch(appendBatch(nil, log.format, 1, events, n, 0))
	if err != nil {
		t.Fatalf("cannot decode events: %s", err)
	}
	return b.events
}

// runRequest admits, prefills and releases one request of the given prompt.
func runRequest(c *prefixCache, tokens []uint32, outBlocks int) (hit int) {
	hashes, _ := appendBlockHashes(nil, nil, tokens, c.blockSize, "")
	hit = c.match(hashes, len(hashes))
	need := blocksFor(len(tokens), c.blockSize) + outBlocks - hit
	if !c.fits(hashes, hit, need) {
		panic(fmt.Sprintf("request of %d blocks does not fit", need))
	}
	held := c.pin(nil, hashes[:hit])
	c.allocate(need)
	held, used := c.store(held, hashes, hit, tokens, nil)
	c.release(held, need-used)
	return hit
}

func wire(tokens []uint32, bs int) []uint64 {
	hashes, _ := appendBlockHashes(nil, nil, tokens, bs, "")
	w := make([]uint64, len(hashes))
	for i := range hashes {
		w[i] = hashes[i].wireInt()
	}
	return w
}

func TestCacheEvictsLeastRecentlyUsed(t *testing.T) {
	for _, era := range []Era{EraMap, EraPositional, EraV08} {
		t.Run(era.String(), func(t *testing.T) {
			log := newEventLog(era, HashInt)
			c := newPrefixCache(8, 4, log)
			a, b, d := tokensOf(1, 12), tokensOf(2, 12), tokensOf(3, 12) // 3 blocks each

			if hit := runRequest(c, a, 1); hit != 0 {
				t.Fatalf("cold A hit %d", hit)
			}
			ev := takeEvents(t, log)
			if len(ev) != 1 || ev[0].typ != "BlockStored" || fmt.Sprint(ev[0].hashes) != fmt.Sprint(wire(a, 4)) ||
				ev[0].parent != nil || fmt.Sprint(ev[0].tokens) != fmt.Sprint(a) || ev[0].blockSize != 4 {
				t.Fatalf("A events %+v", ev)
			}
			runRequest(c, b, 1)
			takeEvents(t, log)
			// Touch A so that B is the least recently used.
			if hit := runRequest(c, a, 1); hit != 3 {
				t.Fatalf("warm A hit %d blocks", hit)
			}
			if ev := takeEvents(t, log); len(ev) != 0 {
				t.Fatalf("a full hit emitted %+v", ev)
			}
			if c.cachedBlocks() != 6 || c.usedBlocks() != 0 {
				t.Fatalf("cached %d used %d", c.cachedBlocks(), c.usedBlocks())
			}
			// D needs 4 blocks, 2 are free: B's last two blocks go, last block first.
			runRequest(c, d, 1)
			ev = takeEvents(t, log)
			wb := wire(b, 4)
			if len(ev) != 3 || ev[0].typ != "BlockRemoved" || ev[1].typ != "BlockRemoved" || ev[2].typ != "BlockStored" ||
				ev[0].hashes[0] != wb[2] || ev[1].hashes[0] != wb[1] {
				t.Fatalf("D events %+v, B hashes %v", ev, wb)
			}
			if c.evictions != 2 {
				t.Fatalf("evictions %d", c.evictions)
			}
			if hit := runRequest(c, a, 0); hit != 3 {
				t.Fatalf("recently used A was evicted: hit %d", hit)
			}
			if hit := runRequest(c, b, 0); hit != 1 {
				t.Fatalf("B after eviction hit %d blocks, want its surviving first block", hit)
			}
		})
	}
}

func TestCachePinnedBlocksSurvive(t *testing.T) {
	c := newPrefixCache(6, 4, nil)
	a := tokensOf(1, 12)
	hashes, _ := appendBlockHashes(nil, nil, a, 4, "")
	held := c.pin(nil, nil)
	c.allocate(3)
	held, _ = c.store(held, hashes, 0, a, nil)
	// A holds its 3 blocks; 3 free blocks remain for others, no eviction possible.
	if !c.fits(nil, 0, 3) || c.fits(nil, 0, 4) {
		t.Fatalf("fits: free %d lru %d", c.free, c.lruLen)
	}
	// A second request sharing A's blocks pins them without more room.
	if hit := c.match(hashes, 3); hit != 3 || !c.fits(hashes, 3, 3) {
		t.Fatalf("shared blocks: hit %d", hit)
	}
	c.clear()
	if c.cachedBlocks() != 0 || c.usedBlocks() != 3 {
		t.Fatalf("after clear: cached %d used %d", c.cachedBlocks(), c.usedBlocks())
	}
	c.release(held, 0)
	if c.free != 6 || c.lruLen != 0 {
		t.Fatalf("after release: free %d lru %d", c.free, c.lruLen)
	}
}

func TestCacheAdoptsBlocksStoredMeanwhile(t *testing.T) {
	log := newEventLog(EraMap, HashInt)
	c := newPrefixCache(16, 4, log)
	a := tokensOf(1, 8)
	hashes, _ := appendBlockHashes(nil, nil, a, 4, "")
	// Two requests miss at once, each with 2 private blocks.
	c.allocate(2)
	c.allocate(2)
	h1, used1 := c.store(nil, hashes, 0, a, nil)
	h2, used2 := c.store(nil, hashes, 0, a, nil)
	if used1 != 2 || used2 != 2 || c.cachedBlocks() != 2 || c.free != 14 {
		t.Fatalf("used %d %d cached %d free %d", used1, used2, c.cachedBlocks(), c.free)
	}
	if ev := takeEvents(t, log); len(ev) != 1 {
		t.Fatalf("events %+v, want one BlockStored", ev)
	}
	c.release(h1, 0)
	c.release(h2, 0)
	if c.free != 14 || c.lruLen != 2 {
		t.Fatalf("free %d lru %d", c.free, c.lruLen)
	}
}
