// Package trie holds the prompts one upstream target has served, for the
// cache_aware strategy (docs/architecture.md, "Routing rules"): a compressed
// (radix) byte trie per target, matched lock-free on every request and
// updated after forwarding.
//
//	tr := trie.New(maxNodes)       // one per target
//	score := float64(tr.Match(key)) / float64(len(key))
//	tr.Insert(key)                 // after forwarding to this target
//
// # Shape
//
// The trie is the canonical radix tree of the stored prompts: a node exists
// for every non-empty prefix that is a stored prompt or is followed by two or
// more distinct bytes; every other prefix lies inside an edge. The root (the
// empty prefix) is not counted. So a node either ends a prompt or branches,
// a prompt that is a prefix of another ends at a node inside the other's
// path, and the node count depends only on the set of stored prompts. The
// tests compute that count from whole prompts (model_test.go) and require
// Nodes to equal it after every operation.
//
// # Arenas
//
// Nodes live in a slab of fixed pages of 1024 32-byte nodes, addressed by
// uint32 index (0 is nil, 1 the root); pages never move, so a node index stays
// valid while the slab grows. A node holds its edge as (offset, length) in the
// byte arena, the arena offset of its child block (the only field that
// changes while the node is reachable) and writer-only bookkeeping (parent,
// prompt record, live flag).
//
// Edge bytes and child blocks share one byte arena: a []byte addressed by
// offset. A child block is [count-1][first byte of each child][uint32 index
// of each child]; a lookup is one IndexByte over at most 256 bytes. Free
// space is kept as coalesced holes in power-of-two bins (segregated fit) with
// a bump-allocated tail; a hole is found by its start or end offset in an
// open-addressing table that deletes without tombstones (holes.go), which
// release needs to merge a freed range with its neighbours. When the arena is full it is copied into a slice a
// quarter bigger and the new slice is published; readers holding the old one
// keep reading it (it is never written again) until the garbage collector
// frees it. The arena therefore has one Go pointer, the slab one per page:
// the garbage collector does not scan per-node pointers.
//
// Prompts are records in a writer-only LRU list (least recently inserted
// first); a node that ends a prompt points to its record and back.
//
// # Publication: copy-on-write
//
// Everything a reader looks at - a node's edge offset and length, an edge's
// bytes, a child block - is immutable while a reader can reach it. Writes
// happen in unreachable memory (fresh space, or space reclaimed after a grace
// period) and become visible through one atomic store of a child-block
// offset:
//
//   - a new leaf: write the edge and the node, write the parent's new child
//     block, store it in the parent;
//   - a split of edge x at k: new nodes m (first k bytes) and x2 (the rest,
//     x's children), a new block for m, then one store replacing x by m in
//     the parent's block; m and x2 share x's bytes, nothing is copied;
//   - a merge of a node q with its only child c (after an eviction): a new
//     node with q's edge followed by c's and c's children, then one store
//     replacing q in its parent;
//   - removing a leaf: one store of the parent's block without it.
//
// A reader therefore sees, at each node, either the old or the new subtree,
// both complete: a prompt stored before and after a write matches in full
// during it (TestConcurrentMatchAndInsert pins one and checks every Match).
// A racing Match returns the length of a prefix of key that was stored at
// some moment during the call - it may miss a prompt inserted during the call
// or still see one evicted during it - never more than len(key), never a
// panic (every index is also bounds-checked).
//
// Writers are serialised by a mutex that Match never takes. Insert walks and
// changes the trie under it; a long key makes the walk, and arena growth or a
// merge that must copy an edge make copies, all under that mutex: they delay
// other Inserts, never a Match.
//
// # Several tries at once
//
// The cache strategies match one key against every eligible target's trie.
// On tries larger than the processor's caches most of a level's time is cache
// misses - the child block, the child node, its edge - each waiting for the
// last, and tries matched one after another wait for all of them in a row.
// MatchEach takes the same steps for all the tries side by side, one level of
// each in turn and each level in phases (every trie's block, then every
// trie's node, then every trie's edge), so that the misses of different tries
// are in flight together: BenchmarkMatchFour gives 4.0 µs for four cold tries
// one after another and 1.7 µs side by side, and 1.42 against 1.56 µs on tries
// the caches hold. Its results equal Match's (TestMatchEach, FuzzTrie).
//
// # Reclamation: epochs
//
// A retired node slot or byte range is reused only after a grace period, so
// no reader ever sees reused memory. Match registers in one of two reader
// counters (by epoch parity, striped over 16 cache lines) for the length of
// the call: two atomic adds and two loads. The writer puts what it unlinks
// into a retiring batch; at the start of each Insert it frees the previous
// batch if every counter of that batch's parity reads zero, then flips the
// epoch and makes the retiring batch the waiting one. A reader that could
// reach a waiting slot entered before the flip and is counted in the old
// parity; one that enters later can only reach live slots. While a reader of
// the old parity lingers (e.g. descheduled inside Match) the writer goes on,
// and retired space waits in limbo while the arenas grow, until limbo holds
// more than 1024 nodes plus a quarter of the live ones (or 1 MiB plus a
// quarter of the live bytes): then the writer yields until that reader is
// done, which bounds limbo at about a quarter of the live trie. Readers
// never wait. TestGracePeriod stalls a reader and checks that nothing it could
// reach is rewritten and that the writer then waits; without the grace
// period the race detector and the pinned-prompt test fail.
//
// Because reuse always follows the readers' atomic decrement, which the
// writer observes, the race detector sees every reuse ordered after the
// reads, and the immutable data can be read with plain loads (memequal,
// IndexByte) at memory speed.
//
// Reset publishes a fresh, empty state; readers still inside Match finish on
// the old one, which is never reused and is freed by the garbage collector.
//
// # Eviction
//
// Before adding a prompt, Insert computes what it needs: 0 nodes when it ends
// at a branching node, 1 when it ends inside an edge or hangs a leaf under a
// node, 2 when it leaves inside an edge; and the bytes past the match. While
// that would exceed the ceiling it evicts the least recently inserted prompt:
// its node loses the prompt; a node with two or more children stays, one
// with a single child merges with it, a leaf is removed and then its parent
// merges with its last child if it no longer branches. An eviction thus
// removes at most two nodes and touches only the pruned prompt's node, its
// parent, one child and the child blocks above them: it never walks the
// tree. Its cost is two or three child-block copies and parent fix-ups (at
// most 256 entries each) plus, for a merge whose two edges are not adjacent
// in the arena, a copy of one of them if the space next to the other is
// free, else of both. Nodes on the path of a kept
// prompt are never removed, only merged, so shared system prompts survive.
// The insertion point is recomputed only if an eviction retired the node it
// hangs from.
//
// A single prompt needs one node once everything else is gone, so with a node
// ceiling alone every prompt is stored whole, however long. NewLimited adds a
// ceiling on stored edge bytes; a prompt longer than it is stored cut to its
// first maxEdgeBytes bytes (the prefix is what Match scores). Keys longer than
// 2 GiB are cut to 2 GiB.
//
// # Memory
//
// BenchmarkMemory measures, for 10k nodes of chat turns (~1 KiB edges) and
// 158k nodes of tiny random keys (~10-byte edges): 52-58 bytes per node for the
// node slab, child blocks, prompt records and allocator index (target <= 64),
// and 1.09-1.23 arena bytes per stored edge byte (growth slack and holes
// included).
//
// # Metrics
//
// Stats returns, for /metrics per target: Nodes (gauge), EdgeBytes (stored
// edge bytes, i.e. distinct prompt prefix bytes; gauge), Prompts (gauge),
// Evictions (prompts pruned by the ceiling; a counter that survives Reset)
// and ArenaBytes (approximate heap held by the arenas, including space
// waiting for reuse; gauge). Nodes is also available alone as one atomic
// load, for finding the least-warmed target on the hot path.
package trie
