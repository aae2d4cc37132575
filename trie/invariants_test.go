package trie

import (
	"fmt"
	"slices"
	"unsafe"
)

// keptPrompts returns the stored prompts, least recently inserted first.
func (t *Trie) keptPrompts() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.st.Load()
	var out []string
	for r := s.recs[0].next; r != 0; r = s.recs[r].next {
		out = append(out, string(s.pathBytes(s.recs[r].node)))
	}
	return out
}

// pathBytes returns the bytes on the path from the root to the end of node i.
func (s *state) pathBytes(i uint32) []byte {
	var parts [][]byte
	for ; i != rootNode; i = s.nodes.at(i).parent {
		parts = append(parts, s.edge(i))
	}
	var b []byte
	for j := len(parts) - 1; j >= 0; j-- {
		b = append(b, parts[j]...)
	}
	return b
}

// checkInvariants verifies the structure: canonical radix shape, parent links,
// counters, LRU ring, and that live, retired and free bytes and node slots
// partition the arenas exactly.
func (t *Trie) checkInvariants() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.st.Load()
	if sz := unsafe.Sizeof(node{}); sz != 32 {
		return fmt.Errorf("node size %d, heapBytes assumes 32", sz)
	}
	var spans []span
	seenNode := map[uint32]string{}
	nodes, edgeBytes, kidsBytes, prompts := 0, 0, 0, 0
	stack := []uint32{rootNode}
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if _, ok := seenNode[i]; ok {
			return fmt.Errorf("node %d reached twice", i)
		}
		seenNode[i] = "live"
		n := s.nodes.at(i)
		if !n.live {
			return fmt.Errorf("node %d reachable but not live", i)
		}
		if i != rootNode {
			nodes++
			if n.n == 0 {
				return fmt.Errorf("node %d has an empty edge", i)
			}
			edgeBytes += int(n.n)
			spans = append(spans, span{n.off, uint64(n.n)})
			kids := s.kidCount(n.kids.Load())
			if n.prompt == 0 && kids < 2 {
				return fmt.Errorf("node %d has no prompt and %d children", i, kids)
			}
		}
		if n.prompt != 0 {
			prompts++
			if s.recs[n.prompt].node != i {
				return fmt.Errorf("node %d prompt record %d points to %d", i, n.prompt, s.recs[n.prompt].node)
			}
		}
		o := n.kids.Load()
		if o == 0 {
			continue
		}
		count := s.kidCount(o)
		kidsBytes += int(blockSize(count))
		spans = append(spans, span{o, blockSize(count)})
		var firsts []byte
		for j := range count {
			c := s.kidAt(o, j)
			key := s.bytes.buf[o+1+uint64(j)]
			cn := s.nodes.at(c)
			if cn.parent != i {
				return fmt.Errorf("node %d child %d has parent %d", i, c, cn.parent)
			}
			if s.bytes.buf[cn.off] != key {
				return fmt.Errorf("node %d child %d keyed %q but edge starts %q", i, c, key, s.bytes.buf[cn.off])
			}
			if slices.Contains(firsts, key) {
				return fmt.Errorf("node %d has two children for %q", i, key)
			}
			firsts = append(firsts, key)
			if findKid(s.bytes.buf, o, key) != c {
				return fmt.Errorf("node %d: findKid(%q) disagrees", i, key)
			}
			stack = append(stack, c)
		}
	}
	if nodes != s.nodeCount || edgeBytes != s.edgeBytes || kidsBytes != s.kidsBytes || prompts != s.promptCount {
		return fmt.Errorf("counted nodes=%d edgeBytes=%d kidsBytes=%d prompts=%d, state says %d %d %d %d",
			nodes, edgeBytes, kidsBytes, prompts, s.nodeCount, s.edgeBytes, s.kidsBytes, s.promptCount)
	}
	if t.Nodes() != nodes || t.Stats().EdgeBytes != edgeBytes || t.Stats().Prompts != prompts {
		return fmt.Errorf("published counters %+v disagree with the structure", t.Stats())
	}
	if nodes > t.maxNodes {
		return fmt.Errorf("%d nodes above the ceiling %d", nodes, t.maxNodes)
	}
	if t.maxBytes > 0 && edgeBytes > t.maxBytes {
		return fmt.Errorf("%d edge bytes above the ceiling %d", edgeBytes, t.maxBytes)
	}

	// LRU ring.
	ring := 0
	for r, prev := s.recs[0].next, uint32(0); r != 0; prev, r = r, s.recs[r].next {
		if s.recs[r].prev != prev {
			return fmt.Errorf("prompt record %d: prev %d, want %d", r, s.recs[r].prev, prev)
		}
		if s.nodes.at(s.recs[r].node).prompt != r {
			return fmt.Errorf("prompt record %d points to node %d which does not point back", r, s.recs[r].node)
		}
		if ring++; ring > len(s.recs) {
			return fmt.Errorf("LRU ring loops")
		}
	}
	if ring != prompts {
		return fmt.Errorf("LRU ring has %d prompts, tree has %d", ring, prompts)
	}

	// Node slots: live, retired (waiting for a grace period) and spare
	// partition [2, next).
	for _, l := range []struct {
		what  string
		nodes []uint32
	}{{"retiring", s.retiring.nodes}, {"waiting", s.waiting.nodes}, {"spare", s.nodes.spare}} {
		for _, i := range l.nodes {
			if prev, ok := seenNode[i]; ok {
				return fmt.Errorf("node slot %d is both %s and %s", i, prev, l.what)
			}
			seenNode[i] = l.what
			if l.what != "spare" && s.nodes.at(i).live {
				return fmt.Errorf("retired node %d still marked live", i)
			}
		}
	}
	if want := int(s.nodes.next) - 1; len(seenNode) != want {
		return fmt.Errorf("%d node slots accounted for, %d handed out", len(seenNode), want)
	}

	// Arena bytes: live edges and blocks, retired ranges and free holes
	// partition [1, top).
	spans = append(spans, s.retiring.ranges...)
	spans = append(spans, s.waiting.ranges...)
	free := uint64(0)
	for r := range s.bytes.ranges {
		if slices.Contains(s.bytes.spare, int32(r)) {
			continue
		}
		h := s.bytes.ranges[r]
		spans = append(spans, span{h.off, h.n})
		free += h.n
	}
	if free != s.bytes.free {
		return fmt.Errorf("free holes sum to %d, arena says %d", free, s.bytes.free)
	}
	slices.SortFunc(spans, func(a, b span) int { return int(a.off) - int(b.off) })
	at := uint64(1)
	for _, sp := range spans {
		if sp.off != at {
			return fmt.Errorf("arena: span at %d (len %d), expected one at %d (gap or overlap)", sp.off, sp.n, at)
		}
		at += sp.n
	}
	if at != s.bytes.top {
		return fmt.Errorf("arena spans end at %d, top is %d", at, s.bytes.top)
	}
	return nil
}
