package trie

import "math/bits"

// holeIndex finds a free hole of the byte arena by its start or its end offset: what release needs to merge
// a freed range with the holes on either side. It is an open-addressing table with linear probing and
// backward-shift deletion. The arena makes and merges holes on every eviction, and a table that deletes by
// shifting keeps no tombstones, so lookups stay one or two probes however long the churn goes on (Go's
// built-in map, used before, spent more time probing than the rest of release together).
//
// A key is an offset shifted left by one, its low bit telling starts (0) from ends (1); offsets are at
// least 1 (offset 0 means "no child block"), so key 0 marks an empty slot.
type holeIndex struct {
	slots []holeSlot
	n     int  // keys held
	shift uint // 64 - log2(len(slots))
}

type holeSlot struct {
	key uint64
	r   int32 // index into byteArena.ranges
}

const minHoleSlots = 16

func startKey(off uint64) uint64 { return off << 1 }
func endKey(end uint64) uint64   { return end<<1 | 1 }

// home is the slot where key k's probe starts (Fibonacci hashing).
func (h *holeIndex) home(k uint64) int {
	return int((k * 0x9E3779B97F4A7C15) >> h.shift)
}

func (h *holeIndex) get(k uint64) (int32, bool) {
	if h.n == 0 {
		return 0, false
	}
	mask := len(h.slots) - 1
	for i := h.home(k); ; i = (i + 1) & mask {
		switch h.slots[i].key {
		case k:
			return h.slots[i].r, true
		case 0:
			return 0, false
		}
	}
}

// put maps k to r. k must not be held already (holes never share a start or an end).
func (h *holeIndex) put(k uint64, r int32) {
	if 4*(h.n+1) > 3*len(h.slots) { // load at most 3/4
		h.grow()
	}
	mask := len(h.slots) - 1
	i := h.home(k)
	for h.slots[i].key != 0 {
		i = (i + 1) & mask
	}
	h.slots[i] = holeSlot{key: k, r: r}
	h.n++
}

// del removes k if held. Each entry after it in the same run moves back into the gap unless that would
// put it before its home slot, so every key stays reachable from its home without tombstones.
func (h *holeIndex) del(k uint64) {
	if h.n == 0 {
		return
	}
	mask := len(h.slots) - 1
	i := h.home(k)
	for h.slots[i].key != k {
		if h.slots[i].key == 0 {
			return
		}
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; h.slots[j].key != 0; j = (j + 1) & mask {
		// The entry at j may fill the gap at i only if its home is not cyclically within (i, j].
		if home := h.home(h.slots[j].key); (j-home)&mask >= (j-i)&mask {
			h.slots[i] = h.slots[j]
			i = j
		}
	}
	h.slots[i] = holeSlot{}
	h.n--
}

func (h *holeIndex) grow() {
	size := max(2*len(h.slots), minHoleSlots)
	old := h.slots
	h.slots = make([]holeSlot, size)
	h.shift = 64 - uint(bits.TrailingZeros(uint(size)))
	h.n = 0
	for _, s := range old {
		if s.key != 0 {
			h.put(s.key, s.r)
		}
	}
}

// heapBytes is the memory the table holds.
func (h *holeIndex) heapBytes() uint64 { return uint64(cap(h.slots)) * 16 }
