package trie

import (
	"bytes"
	"encoding/binary"
	"sync/atomic"
)

const (
	pageShift = 10
	pageLen   = 1 << pageShift
	pageMask  = pageLen - 1

	nilNode  uint32 = 0
	rootNode uint32 = 1
)

// node is one radix-tree node: the edge that leads to it and its children.
//
// off, n and the child block a node points to never change while a reader
// can reach them: a node whose edge must change is replaced by a new node
// (copy-on-write), and its old slot is reused only after a grace period.
// kids is the only field a live node changes, and it changes atomically.
type node struct {
	// kids is the arena offset of the child block, 0 for a leaf.
	kids atomic.Uint64
	// off and n locate the edge bytes in the arena; n >= 1 except for the root.
	off uint64
	n   uint32

	// The fields below are the writer's bookkeeping; readers never look at them.
	parent uint32
	prompt uint32 // promptRec index when a prompt ends here, else 0
	live   bool   // false once retired
}

type nodePage [pageLen]node

// nodeSlab is the node arena: fixed pages that never move, addressed by a
// uint32 index. Index 0 is nil and index 1 the root.
type nodeSlab struct {
	pages []*nodePage
	view  atomic.Pointer[[]*nodePage]
	next  uint32 // first never-used index
	spare []uint32
}

func (ns *nodeSlab) init() {
	ns.pages = append(ns.pages, new(nodePage))
	ns.publish()
	ns.next = rootNode + 1
	ns.at(rootNode).live = true
}

func (ns *nodeSlab) publish() {
	p := ns.pages
	ns.view.Store(&p)
}

func (ns *nodeSlab) at(i uint32) *node {
	return &ns.pages[i>>pageShift][i&pageMask]
}

// alloc returns an unused slot: one freed after a grace period, or a fresh one.
func (ns *nodeSlab) alloc() uint32 {
	if k := len(ns.spare); k > 0 {
		i := ns.spare[k-1]
		ns.spare = ns.spare[:k-1]
		return i
	}
	i := ns.next
	if int(i>>pageShift) == len(ns.pages) {
		ns.pages = append(ns.pages, new(nodePage))
		ns.publish()
	}
	ns.next++
	return i
}

// Child block layout at arena offset o (count = 1..256 children):
//
//	o                 count-1
//	o+1 .. o+count    first edge byte of each child, unsorted
//	then              count little-endian uint32 child indexes
//
// A block is immutable once published; adding, removing or replacing a child
// writes a new block and publishes it with one atomic store to node.kids.
func blockSize(count int) uint64 {
	return 1 + 5*uint64(count)
}

// findKid returns the child of block o whose edge starts with b, or nilNode.
// It is bounds-checked so that it cannot panic on any (o, buf).
func findKid(buf []byte, o uint64, b byte) uint32 {
	if o >= uint64(len(buf)) {
		return nilNode
	}
	return kidIn(buf, o, buf[o], b)
}

// kidIn is findKid for a block whose first byte, count-1, the caller has read (o < len(buf)).
func kidIn(buf []byte, o uint64, count1, b byte) uint32 {
	count := uint64(count1) + 1
	keys := o + 1
	idx := keys + count
	if idx+4*count > uint64(len(buf)) {
		return nilNode
	}
	j := bytes.IndexByte(buf[keys:idx], b)
	if j < 0 {
		return nilNode
	}
	return binary.LittleEndian.Uint32(buf[idx+4*uint64(j):])
}
