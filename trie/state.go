package trie

import (
	"encoding/binary"
	"runtime"
)

// state is everything Reset replaces: the arenas, the LRU list and the
// writer's bookkeeping. Apart from match, every method is for the writer,
// which holds Trie.mu.
type state struct {
	nodes nodeSlab
	bytes byteArena

	// recs is the LRU list of prompts, a ring through recs[0]:
	// recs[0].next is the least and recs[0].prev the most recently inserted.
	recs      []promptRec
	spareRecs []uint32

	nodeCount   int
	edgeBytes   int
	kidsBytes   int
	promptCount int

	// retiring collects slots unlinked since the last epoch flip; waiting
	// holds the previous batch until the readers of waitParity are gone.
	retiring    limbo
	waiting     limbo
	waitParity  uint64
	waitPending bool
}

type promptRec struct {
	node uint32
	prev uint32
	next uint32
}

type limbo struct {
	nodes  []uint32
	ranges []span
	bytes  uint64 // sum of ranges
}

func (l *limbo) empty() bool {
	return len(l.nodes) == 0 && len(l.ranges) == 0
}

func (l *limbo) addRange(off uint64, n uint64) {
	l.ranges = append(l.ranges, span{off: off, n: n})
	l.bytes += n
}

// limboWait is what the writer does while it waits for readers to leave
// (a variable so that tests can step in).
var limboWait = runtime.Gosched

// Retired space beyond these bounds makes the writer wait for a grace
// period instead of growing the arenas: a reader descheduled inside Match
// must not let memory grow with every Insert made meanwhile.
const (
	limboMinNodes = 1024
	limboMinBytes = 1 << 20
)

func newState() *state {
	s := &state{}
	s.nodes.init()
	s.bytes.init()
	s.recs = append(s.recs, promptRec{})
	return s
}

// reclaim frees the waiting batch once its readers are gone and starts a new
// grace period for the retiring batch. If a reader of the waiting batch is
// still inside Match, the slots stay in limbo until a later Insert, unless
// limbo has outgrown a quarter of the live trie: then the writer yields until
// that reader is done (a Match never blocks, so it finishes as soon as it
// runs). Readers never wait for the writer.
func (s *state) reclaim(e *epochs) {
	if s.waitPending {
		if !e.drained(s.waitParity) {
			if !s.limboFull() {
				return
			}
			for !e.drained(s.waitParity) {
				limboWait()
			}
		}
		s.release(&s.waiting)
	}
	if s.retiring.empty() {
		return
	}
	s.waiting, s.retiring = s.retiring, s.waiting
	s.waitParity = e.flip()
	s.waitPending = true
	if e.drained(s.waitParity) {
		s.release(&s.waiting)
	}
}

func (s *state) release(l *limbo) {
	s.nodes.spare = append(s.nodes.spare, l.nodes...)
	for _, r := range l.ranges {
		s.bytes.release(r.off, r.n)
	}
	l.nodes = l.nodes[:0]
	l.ranges = l.ranges[:0]
	l.bytes = 0
	s.waitPending = false
}

func (s *state) limboFull() bool {
	nodes := len(s.retiring.nodes) + len(s.waiting.nodes)
	bytes := s.retiring.bytes + s.waiting.bytes
	return nodes > limboMinNodes+s.nodeCount/4 ||
		bytes > limboMinBytes+uint64(s.edgeBytes+s.kidsBytes)/4
}

// position is where a key leaves the trie: depth bytes of the key are on the
// path, the last edgeOff of them (0 < edgeOff <= n) on the edge of node.
// For the root edgeOff is 0.
type position struct {
	node    uint32
	edgeOff uint32
	depth   int
}

// newNodes returns how many nodes inserting key at p adds: 0 when key ends at
// an existing node, 1 when it ends inside an edge or hangs a leaf under a
// node, 2 when it leaves inside an edge (split node + leaf).
func (p position) newNodes(s *state, key []byte) int {
	atEnd := p.edgeOff == s.nodes.at(p.node).n
	switch {
	case atEnd && p.depth == len(key):
		return 0
	case atEnd || p.depth == len(key):
		return 1
	default:
		return 2
	}
}

// walk follows key from the root as far as it is present.
func (s *state) walk(key []byte) position {
	cur := rootNode
	d := 0
	for d < len(key) {
		child := s.child(cur, key[d])
		if child == nilNode {
			break
		}
		m := commonPrefix(s.edge(child), key[d:])
		d += m
		if m < int(s.nodes.at(child).n) {
			return position{node: child, edgeOff: uint32(m), depth: d}
		}
		cur = child
	}
	return position{node: cur, edgeOff: s.nodes.at(cur).n, depth: d}
}

// insertAt adds key, which is not stored yet, at p.
func (s *state) insertAt(p position, key []byte) {
	e := s.nodes.at(p.node)
	atEnd := p.edgeOff == e.n
	switch {
	case atEnd && p.depth == len(key):
		// A branching node becomes the end of a prompt.
		s.newPrompt(p.node)
	case atEnd:
		leaf := s.newLeaf(key[p.depth:])
		s.addChild(p.node, leaf)
		s.newPrompt(leaf)
	case p.depth == len(key):
		s.newPrompt(s.split(p.node, p.edgeOff, nilNode))
	default:
		leaf := s.newLeaf(key[p.depth:])
		s.split(p.node, p.edgeOff, leaf)
		s.newPrompt(leaf)
	}
}

// evictOldest prunes the least recently inserted prompt and reports whether
// node watch was retired by doing so.
func (s *state) evictOldest(watch uint32) bool {
	r := s.recs[0].next
	t := s.recs[r].node
	s.unlinkRec(r)
	s.spareRecs = append(s.spareRecs, r)
	s.promptCount--
	tn := s.nodes.at(t)
	tn.prompt = 0
	switch s.kidCount(tn.kids.Load()) {
	case 0:
		s.removeLeaf(t)
	case 1:
		s.merge(t)
	}
	// With two or more children t stays as a branching node.
	return !s.nodes.at(watch).live
}

// removeLeaf deletes leaf t, whose prompt is gone, and merges its parent
// with its last child if the parent no longer branches.
func (s *state) removeLeaf(t uint32) {
	tn := s.nodes.at(t)
	p := tn.parent
	s.removeChild(p, t)
	s.retiring.addRange(tn.off, uint64(tn.n))
	s.edgeBytes -= int(tn.n)
	s.retireNode(t)
	if p == rootNode {
		return
	}
	pn := s.nodes.at(p)
	if pn.prompt == 0 && s.kidCount(pn.kids.Load()) == 1 {
		s.merge(p)
	}
}

// split cuts the edge of x after k bytes. A new node m takes the first k
// bytes and a copy x2 of x the rest; m's children are x2 and leaf (if not
// nil). m replaces x in its parent, x is retired and m is returned.
// The edge bytes are shared, not copied: m and x2 own the two halves.
func (s *state) split(x uint32, k uint32, leaf uint32) uint32 {
	xn := s.nodes.at(x)
	x2 := s.newNode(xn.off+uint64(k), xn.n-k, xn.kids.Load(), xn.prompt)
	if xn.prompt != 0 {
		s.recs[xn.prompt].node = x2
	}
	s.setParents(xn.kids.Load(), x2)

	count := 1
	if leaf != nilNode {
		count = 2
	}
	o := s.newBlock(count)
	s.setKid(o, 0, x2)
	if leaf != nilNode {
		s.setKid(o, 1, leaf)
	}
	m := s.newNode(xn.off, k, o, 0)
	s.setParents(o, m)
	s.replaceChild(xn.parent, x, m)
	s.retireNode(x)
	return m
}

// merge replaces q, which has no prompt and exactly one child c, and c by
// one node n with q's edge followed by c's edge and c's children and prompt.
func (s *state) merge(q uint32) {
	qn := s.nodes.at(q)
	c := s.kidAt(qn.kids.Load(), 0)
	cn := s.nodes.at(c)
	off := s.joinEdges(qn, cn)
	n := s.newNode(off, qn.n+cn.n, cn.kids.Load(), cn.prompt)
	if cn.prompt != 0 {
		s.recs[cn.prompt].node = n
	}
	s.setParents(cn.kids.Load(), n)
	s.replaceChild(qn.parent, q, n)
	s.retireBlock(qn.kids.Load())
	s.retireNode(q)
	s.retireNode(c)
}

// joinEdges returns the offset of q's edge bytes followed by c's. It copies
// as little as it can: nothing when the two are adjacent (the usual case
// after a split), one edge when the space next to the other is free, both
// edges otherwise. Replaced bytes are retired, never overwritten in place.
func (s *state) joinEdges(qn, cn *node) uint64 {
	a := &s.bytes
	qEnd := qn.off + uint64(qn.n)
	if qEnd == cn.off {
		return qn.off
	}
	if a.allocAt(qEnd, uint64(cn.n)) {
		copy(a.buf[qEnd:], a.buf[cn.off:cn.off+uint64(cn.n)])
		s.retiring.addRange(cn.off, uint64(cn.n))
		return qn.off
	}
	if off, ok := a.allocBefore(cn.off, uint64(qn.n)); ok {
		copy(a.buf[off:], a.buf[qn.off:qEnd])
		s.retiring.addRange(qn.off, uint64(qn.n))
		return off
	}
	off := a.alloc(uint64(qn.n) + uint64(cn.n))
	copy(a.buf[off:], a.buf[qn.off:qEnd])
	copy(a.buf[off+uint64(qn.n):], a.buf[cn.off:cn.off+uint64(cn.n)])
	s.retiring.addRange(qn.off, uint64(qn.n))
	s.retiring.addRange(cn.off, uint64(cn.n))
	return off
}

// newNode initialises a free slot. The node is unreachable until its index
// is published in a child block.
func (s *state) newNode(off uint64, n uint32, kids uint64, prompt uint32) uint32 {
	i := s.nodes.alloc()
	nd := s.nodes.at(i)
	nd.off = off
	nd.n = n
	nd.parent = nilNode
	nd.prompt = prompt
	nd.live = true
	nd.kids.Store(kids)
	s.nodeCount++
	return i
}

func (s *state) newLeaf(tail []byte) uint32 {
	off := s.bytes.alloc(uint64(len(tail)))
	copy(s.bytes.buf[off:], tail)
	s.edgeBytes += len(tail)
	return s.newNode(off, uint32(len(tail)), 0, 0)
}

// retireNode takes an unlinked node out of the count; its slot is reused
// after a grace period.
func (s *state) retireNode(i uint32) {
	s.nodes.at(i).live = false
	s.retiring.nodes = append(s.retiring.nodes, i)
	s.nodeCount--
}

func (s *state) edge(i uint32) []byte {
	nd := s.nodes.at(i)
	return s.bytes.buf[nd.off : nd.off+uint64(nd.n)]
}

func (s *state) child(i uint32, b byte) uint32 {
	o := s.nodes.at(i).kids.Load()
	if o == 0 {
		return nilNode
	}
	return findKid(s.bytes.buf, o, b)
}

// Child blocks (layout in node.go). Each change writes a new block, publishes
// it with one atomic store and retires the old one.

func (s *state) kidCount(o uint64) int {
	if o == 0 {
		return 0
	}
	return int(s.bytes.buf[o]) + 1
}

func (s *state) kidAt(o uint64, j int) uint32 {
	count := uint64(s.bytes.buf[o]) + 1
	return binary.LittleEndian.Uint32(s.bytes.buf[o+1+count+4*uint64(j):])
}

func (s *state) newBlock(count int) uint64 {
	size := blockSize(count)
	o := s.bytes.alloc(size)
	s.bytes.buf[o] = byte(count - 1)
	s.kidsBytes += int(size)
	return o
}

// setKid stores child c as entry j of block o, keyed by its first edge byte.
func (s *state) setKid(o uint64, j int, c uint32) {
	s.putKid(o, j, s.bytes.buf[s.nodes.at(c).off], c)
}

// copyKid stores entry k of block old, or c in its place, as entry j of block o. c must be the entry or a
// node whose edge starts with the same byte: the key byte is copied from old, so the children's nodes and
// edges, which are far apart in memory, are not read.
func (s *state) copyKid(o uint64, j int, old uint64, k int, c uint32) {
	s.putKid(o, j, s.bytes.buf[old+1+uint64(k)], c)
}

func (s *state) putKid(o uint64, j int, key byte, c uint32) {
	buf := s.bytes.buf
	count := uint64(buf[o]) + 1
	buf[o+1+uint64(j)] = key
	binary.LittleEndian.PutUint32(buf[o+1+count+4*uint64(j):], c)
}

func (s *state) retireBlock(o uint64) {
	if o == 0 {
		return
	}
	size := blockSize(s.kidCount(o))
	s.retiring.addRange(o, size)
	s.kidsBytes -= int(size)
}

func (s *state) setParents(o uint64, parent uint32) {
	for j := range s.kidCount(o) {
		s.nodes.at(s.kidAt(o, j)).parent = parent
	}
}

func (s *state) addChild(p, c uint32) {
	pn := s.nodes.at(p)
	old := pn.kids.Load()
	count := s.kidCount(old)
	o := s.newBlock(count + 1)
	for j := range count {
		s.copyKid(o, j, old, j, s.kidAt(old, j))
	}
	s.setKid(o, count, c)
	s.nodes.at(c).parent = p
	pn.kids.Store(o)
	s.retireBlock(old)
}

func (s *state) removeChild(p, c uint32) {
	pn := s.nodes.at(p)
	old := pn.kids.Load()
	count := s.kidCount(old)
	var o uint64
	if count > 1 {
		o = s.newBlock(count - 1)
		k := 0
		for j := range count {
			if kid := s.kidAt(old, j); kid != c {
				s.copyKid(o, k, old, j, kid)
				k++
			}
		}
	}
	pn.kids.Store(o)
	s.retireBlock(old)
}

// replaceChild makes to, whose edge starts with the same byte, take from's
// place among p's children, and sets its parent.
func (s *state) replaceChild(p, from, to uint32) {
	pn := s.nodes.at(p)
	old := pn.kids.Load()
	count := s.kidCount(old)
	o := s.newBlock(count)
	for j := range count {
		kid := s.kidAt(old, j)
		if kid == from {
			kid = to
		}
		s.copyKid(o, j, old, j, kid)
	}
	s.nodes.at(to).parent = p
	pn.kids.Store(o)
	s.retireBlock(old)
}

// LRU list of prompts.

func (s *state) newPrompt(n uint32) {
	var r uint32
	if k := len(s.spareRecs); k > 0 {
		r = s.spareRecs[k-1]
		s.spareRecs = s.spareRecs[:k-1]
	} else {
		r = uint32(len(s.recs))
		s.recs = append(s.recs, promptRec{})
	}
	s.recs[r] = promptRec{node: n}
	s.linkNewest(r)
	s.nodes.at(n).prompt = r
	s.promptCount++
}

// touch makes prompt r the most recently inserted.
func (s *state) touch(r uint32) {
	s.unlinkRec(r)
	s.linkNewest(r)
}

func (s *state) linkNewest(r uint32) {
	last := s.recs[0].prev
	s.recs[r].prev = last
	s.recs[r].next = 0
	s.recs[last].next = r
	s.recs[0].prev = r
}

func (s *state) unlinkRec(r uint32) {
	p, n := s.recs[r].prev, s.recs[r].next
	s.recs[p].next = n
	s.recs[n].prev = p
}

// heapBytes approximates the heap held by this state.
func (s *state) heapBytes() uint64 {
	const nodeSize = 32 // unsafe.Sizeof(node{}), checked by a test
	b := s.bytes.heapBytes()
	b += uint64(len(s.nodes.pages))*pageLen*nodeSize + uint64(cap(s.nodes.spare))*4
	b += uint64(cap(s.recs))*12 + uint64(cap(s.spareRecs))*4
	b += uint64(cap(s.retiring.nodes)+cap(s.waiting.nodes))*4 + uint64(cap(s.retiring.ranges)+cap(s.waiting.ranges))*16
	return b
}
