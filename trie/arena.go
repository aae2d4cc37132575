package trie

import (
	"math/bits"
	"sync/atomic"
)

// minArena is the initial size of a byte arena.
const minArena = 4096

// binScan bounds the first-fit scan inside the best-matching bin before a
// larger bin is split; it keeps alloc O(1) while reusing holes of exact size.
const binScan = 8

// span is a range [off, off+n) of arena bytes.
type span struct {
	off uint64
	n   uint64
}

// arenaView is what readers load: the arena slice as of some moment.
type arenaView struct {
	b []byte
}

// freeRange is a free hole in the arena, linked into the bin of its size class.
type freeRange struct {
	off  uint64
	n    uint64
	prev int32
	next int32
	bin  int8
}

// byteArena holds edge bytes and child blocks in one []byte, addressed by offset.
//
// Growth is copy-on-write: a bigger slice is filled and published through
// view, and the old one is left untouched for readers still holding it (the
// garbage collector frees it). The writer only ever writes bytes that no
// reader can reach: fresh space, or holes freed after a grace period.
//
// Free space is kept as coalesced holes in power-of-two bins (a segregated
// fit); the tail [top, len(buf)) is bump-allocated. All methods are for the
// writer only.
type byteArena struct {
	buf  []byte
	view atomic.Pointer[arenaView]
	top  uint64

	ranges  []freeRange
	spare   []int32
	holes   holeIndex // ranges by start and by end offset
	bins    [64]int32
	binMask uint64
	free    uint64 // bytes held in holes below top
}

func (a *byteArena) init() {
	a.buf = make([]byte, minArena)
	a.view.Store(&arenaView{b: a.buf})
	a.top = 1 // offset 0 means "no child block"
	for i := range a.bins {
		a.bins[i] = -1
	}
}

func sizeClass(n uint64) int8 {
	return int8(bits.Len64(n) - 1)
}

// alloc returns the offset of n fresh bytes. The caller must re-read a.buf
// afterwards: alloc may have grown the arena.
func (a *byteArena) alloc(n uint64) uint64 {
	c := sizeClass(n)
	r := a.bins[c]
	for i := 0; r >= 0 && i < binScan; i++ {
		if a.ranges[r].n >= n {
			return a.take(r, n)
		}
		r = a.ranges[r].next
	}
	// Every hole in a bin above c is at least 2^(c+1) > n bytes.
	if m := a.binMask &^ (1<<(uint(c)+1) - 1); m != 0 {
		return a.take(a.bins[bits.TrailingZeros64(m)], n)
	}
	return a.bump(n)
}

// allocAt takes exactly [off, off+n) if that space is free.
func (a *byteArena) allocAt(off, n uint64) bool {
	if off == a.top {
		a.bump(n)
		return true
	}
	r, ok := a.holes.get(startKey(off))
	if !ok || a.ranges[r].n < n {
		return false
	}
	a.take(r, n)
	return true
}

// allocBefore takes [end-n, end) if that space is free and returns end-n.
func (a *byteArena) allocBefore(end, n uint64) (uint64, bool) {
	r, ok := a.holes.get(endKey(end))
	if !ok || a.ranges[r].n < n {
		return 0, false
	}
	h := a.ranges[r]
	a.removeRange(r)
	if h.n > n {
		a.addRange(h.off, h.n-n)
	}
	return end - n, true
}

// release returns [off, off+n) to the free space, merging it with its neighbours.
// The caller guarantees that no reader can reach these bytes any more.
func (a *byteArena) release(off, n uint64) {
	if r, ok := a.holes.get(endKey(off)); ok {
		off = a.ranges[r].off
		n += a.ranges[r].n
		a.removeRange(r)
	}
	if r, ok := a.holes.get(startKey(off + n)); ok {
		n += a.ranges[r].n
		a.removeRange(r)
	}
	if off+n == a.top {
		a.top = off
		return
	}
	a.addRange(off, n)
}

func (a *byteArena) take(r int32, n uint64) uint64 {
	h := a.ranges[r]
	a.removeRange(r)
	if h.n > n {
		a.addRange(h.off+n, h.n-n)
	}
	return h.off
}

func (a *byteArena) bump(n uint64) uint64 {
	if a.top+n > uint64(len(a.buf)) {
		a.grow(a.top + n)
	}
	off := a.top
	a.top += n
	return off
}

// grow copies the arena into a bigger slice. It grows by a quarter (not by
// doubling) to keep the unused tail near 1/8 of the arena on average, at the
// price of copying each byte about four times over the arena's life.
func (a *byteArena) grow(need uint64) {
	size := max(uint64(len(a.buf))+uint64(len(a.buf))/4, need+need/8)
	b := make([]byte, size)
	copy(b, a.buf[:a.top])
	a.buf = b
	a.view.Store(&arenaView{b: b})
}

func (a *byteArena) addRange(off, n uint64) {
	var r int32
	if k := len(a.spare); k > 0 {
		r = a.spare[k-1]
		a.spare = a.spare[:k-1]
	} else {
		r = int32(len(a.ranges))
		a.ranges = append(a.ranges, freeRange{})
	}
	c := sizeClass(n)
	head := a.bins[c]
	a.ranges[r] = freeRange{off: off, n: n, prev: -1, next: head, bin: c}
	if head >= 0 {
		a.ranges[head].prev = r
	}
	a.bins[c] = r
	a.binMask |= 1 << uint(c)
	a.holes.put(startKey(off), r)
	a.holes.put(endKey(off+n), r)
	a.free += n
}

func (a *byteArena) removeRange(r int32) {
	h := a.ranges[r]
	if h.prev >= 0 {
		a.ranges[h.prev].next = h.next
	} else {
		a.bins[h.bin] = h.next
		if h.next < 0 {
			a.binMask &^= 1 << uint(h.bin)
		}
	}
	if h.next >= 0 {
		a.ranges[h.next].prev = h.prev
	}
	a.holes.del(startKey(h.off))
	a.holes.del(endKey(h.off + h.n))
	a.spare = append(a.spare, r)
	a.free -= h.n
}

// heapBytes approximates the heap held by the arena and its free-space index.
func (a *byteArena) heapBytes() uint64 {
	return uint64(cap(a.buf)) + uint64(cap(a.ranges))*32 + uint64(cap(a.spare))*4 + a.holes.heapBytes()
}
