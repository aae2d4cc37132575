package trie

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
)

const (
	// DefaultMaxNodes is the node ceiling used when New gets maxNodes <= 0.
	DefaultMaxNodes = 1_000_000

	// maxNodesLimit keeps node indexes (uint32) far from overflow even with
	// retired slots waiting for their grace period.
	maxNodesLimit = 1 << 30

	// maxKeyLen is the longest prompt stored; longer keys are cut to it.
	// Edge lengths are uint32; 2 GiB keeps the cut portable to 32-bit ints.
	maxKeyLen = math.MaxInt32
)

// Trie is a compressed (radix) byte trie holding the prompts one upstream
// target has served, capped at a node ceiling with LRU-by-insertion eviction.
// See the package documentation for the design.
//
// Match is lock-free and safe for concurrent use with everything else.
// Insert and Reset are safe for concurrent use; they are serialised by an
// internal mutex that Match never takes. A Trie must not be copied.
type Trie struct {
	// mu serialises writers (Insert, Reset). Readers never take it.
	mu sync.Mutex
	st atomic.Pointer[state]

	readers epochs

	maxNodes int
	maxBytes int // 0: no byte ceiling

	// Counters published after every write, for Nodes and Stats.
	nodes      atomic.Int64
	edgeBytes  atomic.Int64
	prompts    atomic.Int64
	arenaBytes atomic.Int64
	evictions  atomic.Uint64

	// owner is a number the owner attaches to the contents (the engine: the cache epoch of the target the
	// prompts were sent to); ResetOwner empties the trie and sets it in one step.
	owner atomic.Uint64
}

// Stats are the counters a Trie exports for /metrics.
type Stats struct {
	// Nodes is the current number of nodes (the root is not counted).
	Nodes int
	// EdgeBytes is the number of stored edge bytes, i.e. the number of
	// distinct non-empty prefixes of the stored prompts.
	EdgeBytes int
	// Prompts is the number of stored prompts.
	Prompts int
	// Evictions is the cumulative number of prompts pruned by the ceiling
	// (it survives Reset, so it can back a Prometheus counter).
	Evictions uint64
	// ArenaBytes approximates the heap held by the node and byte arenas,
	// including space waiting for reuse.
	ArenaBytes int
}

// New returns an empty trie holding at most maxNodes nodes (maxNodes <= 0
// means DefaultMaxNodes).
func New(maxNodes int) *Trie {
	return NewLimited(maxNodes, 0)
}

// NewLimited is like New and also caps the stored edge bytes at maxEdgeBytes
// (<= 0: no byte ceiling). Prompts longer than maxEdgeBytes are stored cut to
// their first maxEdgeBytes bytes.
func NewLimited(maxNodes, maxEdgeBytes int) *Trie {
	if maxNodes <= 0 {
		maxNodes = DefaultMaxNodes
	}
	maxNodes = min(maxNodes, maxNodesLimit)
	t := &Trie{
		maxNodes: maxNodes,
		maxBytes: max(maxEdgeBytes, 0),
	}
	t.st.Store(newState())
	t.publish(t.st.Load())
	return t
}

// Match returns how many leading bytes of key are present in the trie: the
// longest common prefix of key with any stored prompt (a path from the root,
// which may end inside an edge).
//
// Match does not allocate, takes no lock and is safe for concurrent use with
// Insert and Reset. key is only read during the call. When it races a write,
// the result is the length of a prefix of key that was stored at some moment
// during the call; it is never more than len(key).
func (t *Trie) Match(key []byte) int {
	if len(key) == 0 {
		return 0
	}
	c := t.readers.enter()
	n := t.st.Load().match(key)
	t.readers.exit(c)
	return n
}

// Insert records key as the most recently inserted prompt. If key is already
// stored it only becomes the most recent one. When the new prompt would take
// the trie above its ceiling, the least recently inserted prompts are pruned
// first; nodes still on the path of a kept prompt survive.
//
// An empty key is ignored. key is copied; the caller may reuse it after the
// call. Insert is safe for concurrent use; it never blocks Match.
func (t *Trie) Insert(key []byte) {
	if len(key) == 0 {
		return
	}
	if len(key) > maxKeyLen {
		key = key[:maxKeyLen]
	}

	t.mu.Lock()
	defer t.mu.Unlock()
	if t.maxBytes > 0 && len(key) > t.maxBytes {
		key = key[:t.maxBytes]
	}
	s := t.st.Load()
	s.reclaim(&t.readers)

	p := s.walk(key)
	e := s.nodes.at(p.node)
	atEnd := p.edgeOff == e.n
	if atEnd && p.depth == len(key) && e.prompt != 0 {
		s.touch(e.prompt)
		return
	}
	for s.promptCount > 0 && !t.fits(s, p, key) {
		// Eviction removes leaves and merges nodes. While p.node survives,
		// its edge, its depth and its lack of a child for the next key byte
		// are unchanged (merges above it keep the path bytes), so p and the
		// needs computed from it still hold; only when p.node itself went
		// must the key be walked again.
		if s.evictOldest(p.node) {
			p = s.walk(key)
		}
		t.evictions.Add(1)
	}
	s.insertAt(p, key)
	t.publish(s)
}

// SetLimits changes the ceilings (as NewLimited takes them) of a trie in use - a gateway reload that keeps a
// target's routing memory but gives it another share - pruning the least recently inserted prompts at once
// until the trie fits. It is safe for concurrent use; it never blocks Match.
func (t *Trie) SetLimits(maxNodes, maxEdgeBytes int) {
	if maxNodes <= 0 {
		maxNodes = DefaultMaxNodes
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.maxNodes = min(maxNodes, maxNodesLimit)
	t.maxBytes = max(maxEdgeBytes, 0)
	s := t.st.Load()
	s.reclaim(&t.readers)
	pruned := false
	for s.promptCount > 0 && (s.nodeCount > t.maxNodes || (t.maxBytes > 0 && s.edgeBytes > t.maxBytes)) {
		s.evictOldest(rootNode)
		t.evictions.Add(1)
		pruned = true
	}
	if pruned {
		t.publish(s)
	}
}

// Limits returns the ceilings: nodes, and stored edge bytes (0: none).
func (t *Trie) Limits() (maxNodes, maxEdgeBytes int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.maxNodes, t.maxBytes
}

// fits reports whether inserting key at p keeps the trie within its ceilings.
func (t *Trie) fits(s *state, p position, key []byte) bool {
	if s.nodeCount+p.newNodes(s, key) > t.maxNodes {
		return false
	}
	return t.maxBytes == 0 || s.edgeBytes+len(key)-p.depth <= t.maxBytes
}

// Nodes returns the current node count with one atomic load. Safe for concurrent use.
func (t *Trie) Nodes() int {
	return int(t.nodes.Load())
}

// Stats returns the counters for /metrics. Safe for concurrent use; the
// fields are read one by one, not as one snapshot.
func (t *Trie) Stats() Stats {
	return Stats{
		Nodes:      int(t.nodes.Load()),
		EdgeBytes:  int(t.edgeBytes.Load()),
		Prompts:    int(t.prompts.Load()),
		Evictions:  t.evictions.Load(),
		ArenaBytes: int(t.arenaBytes.Load()),
	}
}

// Reset drops every prompt (e.g. when the target is removed) and releases the
// arenas. Readers still inside Match finish on the old contents, which are
// never reused. Safe for concurrent use.
func (t *Trie) Reset() {
	t.mu.Lock()
	s := newState()
	t.st.Store(s)
	t.publish(s)
	t.mu.Unlock()
}

// Owner returns the number attached to the trie's contents (0 until SetOwner or ResetOwner).
func (t *Trie) Owner() uint64 { return t.owner.Load() }

// SetOwner attaches owner to the current contents.
func (t *Trie) SetOwner(owner uint64) { t.owner.Store(owner) }

// ResetOwner drops every prompt, as Reset, and attaches owner to the (empty) contents. It reports
// whether it did anything: false when the trie was already owned by owner, so of several writers that see
// the same stale owner only one empties the trie.
func (t *Trie) ResetOwner(owner uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.owner.Load() == owner {
		return false
	}
	s := newState()
	t.st.Store(s)
	t.publish(s)
	t.owner.Store(owner)
	return true
}

func (t *Trie) publish(s *state) {
	t.nodes.Store(int64(s.nodeCount))
	t.edgeBytes.Store(int64(s.edgeBytes))
	t.prompts.Store(int64(s.promptCount))
	t.arenaBytes.Store(int64(s.heapBytes()))
}

// match is the lock-free read path. Every index and offset is bounds-checked,
// although the grace period guarantees they are valid (see doc.go), so that a
// broken invariant shows up as a short match, never as a panic. MatchEach
// takes the same steps for several tries at once.
func (s *state) match(key []byte) int {
	pages := *s.nodes.view.Load()
	cur := &pages[0][rootNode]
	d := 0
	for d < len(key) {
		ko := cur.kids.Load()
		if ko == 0 {
			break
		}
		// Load the arena and the page table after the child block offset: the
		// block, the child and its edge bytes were all written before the
		// block was published, so these views are recent enough to hold them.
		buf := s.bytes.view.Load().b
		child := findKid(buf, ko, key[d])
		if child == nilNode {
			break
		}
		pages = *s.nodes.view.Load()
		if int(child>>pageShift) >= len(pages) {
			break
		}
		cn := &pages[child>>pageShift][child&pageMask]
		end := cn.off + uint64(cn.n)
		if cn.n == 0 || end < cn.off || end > uint64(len(buf)) {
			break
		}
		edge := buf[cn.off:end]
		m := commonPrefix(edge, key[d:])
		d += m
		if m < len(edge) {
			break
		}
		cur = cn
	}
	return d
}

// MatchEach sets ms[i] to ts[i].Match(key) for every i (0 for a nil ts[i]); ms must be as long as ts.
//
// It takes match's steps for all the tries side by side: one level of each in turn, and each level in
// phases - every trie's child block, then every trie's child node, then every trie's edge - so that the
// loads of different tries are in flight together. On tries too large for the processor's caches a level
// costs a few cache misses, each waiting for the last; matched one after another, the tries wait for all
// of them in a row (BenchmarkMatchFour, four tries: 4.0 µs one after another, 1.7 µs side by side). On
// tries the caches hold the phases cost about a tenth more (1.56 against 1.42 µs).
func MatchEach(ts []*Trie, key []byte, ms []int) {
	if len(ts) == 1 || len(key) == 0 {
		for i, t := range ts {
			ms[i] = 0
			if t != nil {
				ms[i] = t.Match(key)
			}
		}
		return
	}
	var wbuf [8]walk
	for lo := 0; lo < len(ts); lo += len(wbuf) {
		hi := min(lo+len(wbuf), len(ts))
		ws := wbuf[:hi-lo]
		var cs [len(wbuf)]*atomic.Int64
		live := 0
		for j, t := range ts[lo:hi] {
			ws[j] = walk{}
			if t != nil {
				cs[j] = t.readers.enter()
				s := t.st.Load()
				pages := *s.nodes.view.Load()
				ws[j] = walk{s: s, cur: &pages[0][rootNode], live: true}
				live++
			}
		}
		for live > 0 {
			// The child block: its first byte (the child count) is the load that misses.
			for j := range ws {
				w := &ws[j]
				if !w.live {
					continue
				}
				w.ko = w.cur.kids.Load()
				w.buf = w.s.bytes.view.Load().b // after ko, as in match
				if w.ko == 0 || w.ko >= uint64(len(w.buf)) || w.d >= len(key) {
					w.live = false
					live--
					continue
				}
				w.count = w.buf[w.ko]
			}
			// The child: the node's edge place.
			for j := range ws {
				w := &ws[j]
				if !w.live {
					continue
				}
				c := kidIn(w.buf, w.ko, w.count, key[w.d])
				pages := *w.s.nodes.view.Load()
				if c == nilNode || int(c>>pageShift) >= len(pages) {
					w.live = false
					live--
					continue
				}
				w.next = &pages[c>>pageShift][c&pageMask]
				w.end = w.next.off + uint64(w.next.n)
			}
			// The edge: its first 8 bytes against the key's next 8, where most walks end.
			for j := range ws {
				w := &ws[j]
				if !w.live {
					continue
				}
				cn := w.next
				if cn.n == 0 || w.end < cn.off || w.end > uint64(len(w.buf)) {
					w.live = false
					live--
					continue
				}
				w.e = w.buf[cn.off:w.end]
				if rest := key[w.d:]; len(w.e) >= 8 && len(rest) >= 8 {
					if x := binary.LittleEndian.Uint64(w.e) ^ binary.LittleEndian.Uint64(rest); x != 0 {
						w.d += bits.TrailingZeros64(x) / 8
						w.live = false
						live--
					}
				}
			}
			// The rest of the edge.
			for j := range ws {
				w := &ws[j]
				if !w.live {
					continue
				}
				m := commonPrefix(w.e, key[w.d:])
				w.d += m
				if m < len(w.e) {
					w.live = false
					live--
					continue
				}
				w.cur = w.next
			}
		}
		for j, t := range ts[lo:hi] {
			if cs[j] != nil {
				t.readers.exit(cs[j])
			}
			ms[lo+j] = ws[j].d
		}
	}
}

// walk is one of MatchEach's matches in progress: d key bytes matched, at node cur while live.
type walk struct {
	s     *state
	buf   []byte
	e     []byte // next's edge
	cur   *node
	next  *node
	ko    uint64
	end   uint64 // next's edge end
	d     int
	count byte // the child block's first byte
	live  bool
}

// commonPrefix returns the length of the longest common prefix of a and b.
func commonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	a, b = a[:n], b[:n]
	// Most edges on a match path match whole; memequal (SIMD) settles those.
	if bytes.Equal(a, b) {
		return n
	}
	i := 0
	const chunk = 256
	for i+chunk <= n && bytes.Equal(a[i:i+chunk], b[i:i+chunk]) {
		i += chunk
	}
	for i+8 <= n {
		if x := binary.LittleEndian.Uint64(a[i:]) ^ binary.LittleEndian.Uint64(b[i:]); x != 0 {
			return i + bits.TrailingZeros64(x)/8
		}
		i += 8
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}
