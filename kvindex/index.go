package kvindex

import (
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/rolter-ai/rolter/internal/mix"
)

// MaxTargets is the largest number of targets one Index can hold: a block's residency is one uint64 mask.
const MaxTargets = 64

// MaxBlocksPerTarget is the largest max_blocks a target can have: record indexes have 24 bits (see
// engTag). At block size 16 that is 268M tokens of KV cache, beyond any single engine today.
const MaxBlocksPerTarget = maxRecords - 1

// DefaultBlockSize is the block size assumed for a target until its events report one (vLLM's CUDA default).
const DefaultBlockSize = 16

// droppedRingSize is how many engine hashes a target remembers having dropped itself (cap evictions,
// events it could not index), so that a child naming one of them as parent is not mistaken for missed
// events. 32 KiB per target, allocated on the first drop.
const droppedRingSize = 4096

// Index is the exact residency index shared by up to MaxTargets targets: own block key -> bitmask of the
// targets holding that block on the GPU. One lookup per block answers for every target at once.
//
// Match is safe for concurrent use and never blocks on writers. Each target is written only through its
// TargetIndex by one goroutine at a time.
type Index struct {
	res        residency
	maxTargets int

	mu         sync.Mutex // serialises Target
	targets    [MaxTargets]*TargetIndex
	registered atomic.Uint64
	blockSize  [MaxTargets]atomic.Int32
}

// NewIndex returns an index for targets 0..maxTargets-1; maxTargets must be in 1..MaxTargets.
func NewIndex(maxTargets int) *Index {
	if maxTargets < 1 || maxTargets > MaxTargets {
		panic(fmt.Errorf("BUG: maxTargets must be in 1..%d; got %d", MaxTargets, maxTargets))
	}
	ix := &Index{maxTargets: maxTargets}
	for i := range ix.blockSize {
		ix.blockSize[i].Store(DefaultBlockSize)
	}
	return ix
}

// MaxTargets returns the number of targets ix was created for.
func (ix *Index) MaxTargets() int {
	return ix.maxTargets
}

// Target returns the writer handle of target t (0 <= t < MaxTargets()), creating it on the first call with
// a cap of maxBlocks resident blocks (<= 0 or above MaxBlocksPerTarget means MaxBlocksPerTarget). Later
// calls return the same handle and ignore maxBlocks. The handle must be written by one goroutine at a time.
func (ix *Index) Target(t int, maxBlocks int) *TargetIndex {
	if t < 0 || t >= ix.maxTargets {
		panic(fmt.Errorf("BUG: target %d out of range 0..%d", t, ix.maxTargets-1))
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ti := ix.targets[t]; ti != nil {
		return ti
	}
	if maxBlocks <= 0 || maxBlocks > MaxBlocksPerTarget {
		maxBlocks = MaxBlocksPerTarget
	}
	ti := &TargetIndex{
		ix:        ix,
		t:         t,
		bit:       1 << uint(t),
		maxBlocks: maxBlocks,
	}
	ix.targets[t] = ti
	ix.registered.Or(ti.bit)
	return ti
}

// BlockSize returns the block size Match uses for target t: the one its events reported, else
// DefaultBlockSize.
func (ix *Index) BlockSize(t int) int {
	return int(ix.blockSize[t].Load())
}

// Stats returns the number of distinct resident keys and the bytes of the shared table.
// It is safe for concurrent use.
func (ix *Index) Stats() (keys, tableBytes int) {
	return ix.res.stats()
}

// Scratch is reusable state for Match. It is not safe for concurrent use: keep one per goroutine (or pool
// them). The zero value is ready.
type Scratch struct {
	kh keyHasher
}

// Match sets out[t] to the number of leading full blocks of tokens resident on target t's GPU, for every
// t < len(out) (targets beyond MaxTargets() or never registered get 0), and returns the number of full
// blocks of tokens.
//
// Each target's blocks are cut by its own block size (BlockSize(t)); when targets disagree, keys are
// computed once per distinct block size and the return value is for the smallest of them, so a caller that
// mixes block sizes should divide out[t] by len(tokens)/BlockSize(t) instead. The walk stops at the first
// block no remaining target holds. Match does not allocate, does not keep tokens, is safe for concurrent
// use (s excepted) and sees writers' updates without blocking them.
func (ix *Index) Match(tokens []uint32, s *Scratch, out []int) (fullBlocks int) {
	clear(out)
	n := min(len(out), ix.maxTargets)
	pending := ix.registered.Load()
	if n < 64 {
		pending &= 1<<uint(n) - 1
	}
	minBS := 0
	for pending != 0 {
		bs := int(ix.blockSize[bits.TrailingZeros64(pending)].Load())
		var group uint64
		for m := pending; m != 0; m &= m - 1 {
			t := bits.TrailingZeros64(m)
			if int(ix.blockSize[t].Load()) == bs {
				group |= 1 << uint(t)
			}
		}
		pending &^= group
		if minBS == 0 || bs < minBS {
			minBS = bs
		}
		ix.matchGroup(tokens, bs, group, s, out)
	}
	if minBS == 0 {
		minBS = DefaultBlockSize
	}
	return len(tokens) / minBS
}

func (ix *Index) matchGroup(tokens []uint32, bs int, active uint64, s *Scratch, out []int) {
	parent := RootKey
	i := 0
	for ; len(tokens) >= bs; i++ {
		k := s.kh.next(parent, tokens[:bs])
		tokens = tokens[bs:]
		held := ix.res.get(k) & active
		if held != active {
			for m := active &^ held; m != 0; m &= m - 1 {
				out[bits.TrailingZeros64(m)] = i
			}
			active = held
			if active == 0 {
				return
			}
		}
		parent = k
	}
	for m := active; m != 0; m &= m - 1 {
		out[bits.TrailingZeros64(m)] = i
	}
}

// TargetStats is a snapshot of one target's index counters.
type TargetStats struct {
	// Blocks is the number of resident blocks (GPU) the index holds for the target.
	Blocks int
	// BlockSize is the learned block size (DefaultBlockSize until an event reports one).
	BlockSize int
	// Bytes is the memory of the target's own structures (record slab and hash table), excluding the
	// shared table.
	Bytes int

	StoredEvents, RemovedEvents, ClearedEvents uint64
	// StoredBlocks and RemovedBlocks count blocks applied to the index.
	StoredBlocks, RemovedBlocks uint64
	// Evictions counts blocks dropped by the max_blocks cap (LRU).
	Evictions uint64
	// UnknownParents counts BlockStored events whose parent hash the index did not know (not applied).
	UnknownParents uint64
	// UnknownRemoves counts removed hashes the index did not hold (e.g. stored before the subscriber joined).
	UnknownRemoves uint64
	// TokenMismatches counts BlockStored events whose token count is not len(hashes)*block_size (not applied).
	TokenMismatches uint64
	// BlockSizeMismatches counts BlockStored events whose block size differs from the learned one while
	// blocks are resident (not applied).
	BlockSizeMismatches uint64
	// NonGPU counts events for other media (CPU, STORAGE offload tiers), ignored.
	NonGPU uint64
	// Rekeys counts engine hashes stored again with different tokens (old record replaced).
	Rekeys uint64
	// Clears counts resets of the target (AllBlocksCleared, restarts, recovery).
	Clears uint64
}

type targetCounters struct {
	storedEvents, removedEvents, clearedEvents atomic.Uint64
	storedBlocks, removedBlocks, evictions     atomic.Uint64
	unknownParents, unknownRemoves             atomic.Uint64
	tokenMismatches, blockSizeMismatches       atomic.Uint64
	nonGPU, rekeys, clears                     atomic.Uint64
}

// recChunk is the number of records per slab chunk (16 KiB).
const recChunk = 1024

// rec is one resident block of a target: 16 bytes in a slab kept in store order, which is LRU order (see
// TargetIndex.chunks). own == 0 marks a dead record (own keys are never 0, see keyHasher.next).
type rec struct {
	eng, own uint64
}

// TargetIndex is the writer side of one target: it implements Handler and applies events to the shared
// Index. It owns engine hash -> own key (to apply BlockRemoved), the learned block size and an LRU of the
// target's resident blocks capped at maxBlocks.
//
// Handler methods, Clear and AllBlocksCleared must be called by one goroutine at a time (the target's
// ingest goroutine); Blocks, BlockSize and Stats are safe for concurrent use.
type TargetIndex struct {
	ix        *Index
	t         int
	bit       uint64
	maxBlocks int
	kh        keyHasher

	// chunks is the record slab in fixed chunks: no append slack and no copying as a target grows
	// (BenchmarkIndexMemory), at the price of one more load per access. Records [lo, hi) are in store
	// order, the least recent at lo: storing a block appends it (a block stored again moves by leaving a
	// dead record behind), removing one marks it dead, so no record needs LRU links (24 -> 16 bytes, issue
	// 19). Chunks before lo's are released; dead records are compacted away once they outnumber a quarter
	// of the live ones (see reserve).
	chunks [][]rec
	spare  [][]rec // released chunks kept for the next ones needed (see keepSpare)
	lo, hi uint32
	dead   int // dead records in [lo, hi)
	n      int

	// eng is an open-addressing table (linear probing, tombstones) of tagged slab indexes, keyed by the
	// engine hash in the slab: 4 bytes per slot instead of a map entry.
	eng      []uint32
	engTombs int

	// dups counts, per own key, records beyond the first: two engine blocks may carry the same tokens
	// (cache_salt, LoRA, several KV cache groups), and the target's bit must stay until the last goes.
	dups map[uint64]uint32

	dropped  []uint64
	droppedN uint64
	// synced means the index has seen every event since the engine's cache was empty, so an unknown
	// parent that the index did not drop itself proves missed events.
	synced bool
	// missed is set when an unknown parent proves missed events; the Stream takes it after each batch.
	missed bool
	// clearedEvent is set by AllBlocksCleared; the Stream takes it after each batch (a batch holding one
	// makes the index exact whatever was lost before). sinceCleared stays set from AllBlocksCleared until
	// a block is stored or the index is cleared otherwise: the trust reason "cleared".
	clearedEvent, sinceCleared bool
	// learned is set once an event reported the block size.
	learned bool

	blocks atomic.Int64
	bytes  atomic.Int64
	c      targetCounters
}

var _ Handler = (*TargetIndex)(nil)

// Blocks returns the number of resident blocks held for the target.
func (ti *TargetIndex) Blocks() int {
	return int(ti.blocks.Load())
}

// BlockSize returns the target's learned block size (DefaultBlockSize until an event reports one).
func (ti *TargetIndex) BlockSize() int {
	return ti.ix.BlockSize(ti.t)
}

// Stats returns a snapshot of the target's counters. It is safe for concurrent use; Bytes is read without
// synchronisation from the writer and may be slightly stale.
func (ti *TargetIndex) Stats() TargetStats {
	c := &ti.c
	return TargetStats{
		Blocks:              ti.Blocks(),
		BlockSize:           ti.BlockSize(),
		Bytes:               int(ti.bytes.Load()),
		StoredEvents:        c.storedEvents.Load(),
		RemovedEvents:       c.removedEvents.Load(),
		ClearedEvents:       c.clearedEvents.Load(),
		StoredBlocks:        c.storedBlocks.Load(),
		RemovedBlocks:       c.removedBlocks.Load(),
		Evictions:           c.evictions.Load(),
		UnknownParents:      c.unknownParents.Load(),
		UnknownRemoves:      c.unknownRemoves.Load(),
		TokenMismatches:     c.tokenMismatches.Load(),
		BlockSizeMismatches: c.blockSizeMismatches.Load(),
		NonGPU:              c.nonGPU.Load(),
		Rekeys:              c.rekeys.Load(),
		Clears:              c.clears.Load(),
	}
}

// groupSalt separates the engine hashes of KV cache groups (hybrid models), which share one hash space
// per target; group 0 and nil keep the hash unchanged.
func groupSalt(group int64, has bool) uint64 {
	if !has || group == 0 {
		return 0
	}
	return uint64(group) * 0x9e3779b97f4a7c15
}

// BlockStored applies a BlockStored event. See the type doc for the calling rules.
func (ti *TargetIndex) BlockStored(ev *BlockStored) {
	ti.c.storedEvents.Add(1)
	if !isGPU(ev.Medium) {
		ti.c.nonGPU.Add(1)
		return
	}
	if len(ev.Hashes) == 0 {
		return
	}
	salt := groupSalt(ev.GroupIdx, ev.HasGroupIdx)
	bs := ev.BlockSize
	if bs <= 0 || len(ev.Tokens) != len(ev.Hashes)*bs {
		// Sparse blocks (vllm-project/vllm#44488) or a broken emitter: no key can be trusted.
		ti.c.tokenMismatches.Add(1)
		ti.dropAll(ev.Hashes, salt)
		return
	}
	if cur := ti.BlockSize(); bs != cur || !ti.learned {
		if ti.n > 0 && bs != cur {
			// A second block size on a target with resident blocks (hybrid groups): keep the first.
			ti.c.blockSizeMismatches.Add(1)
			ti.dropAll(ev.Hashes, salt)
			return
		}
		ti.ix.blockSize[ti.t].Store(int32(bs))
		ti.learned = true
	}
	parent := RootKey
	if ev.HasParent {
		idx, ok := ti.lookup(ev.Parent ^ salt)
		if !ok {
			// Never guess a key (docs/architecture.md, "KV-event path"). If the index did not drop the
			// parent itself, events were missed and the Stream treats the target like one with a gap.
			ti.c.unknownParents.Add(1)
			if ti.synced && !ti.wasDropped(ev.Parent^salt) {
				ti.missed = true
			}
			ti.dropAll(ev.Hashes, salt)
			return
		}
		parent = ti.rec(idx).own
	}
	tokens := ev.Tokens
	for _, h := range ev.Hashes {
		parent = ti.kh.next(parent, tokens[:bs])
		tokens = tokens[bs:]
		ti.insert(h^salt, parent)
	}
	ti.sinceCleared = false
	ti.c.storedBlocks.Add(uint64(len(ev.Hashes)))
	ti.publishSize()
}

// BlockRemoved applies a BlockRemoved event. See the type doc for the calling rules.
func (ti *TargetIndex) BlockRemoved(ev *BlockRemoved) {
	ti.c.removedEvents.Add(1)
	if !isGPU(ev.Medium) {
		ti.c.nonGPU.Add(1)
		return
	}
	salt := groupSalt(ev.GroupIdx, ev.HasGroupIdx)
	for _, h := range ev.Hashes {
		idx, ok := ti.lookup(h ^ salt)
		if !ok {
			ti.c.unknownRemoves.Add(1)
			continue
		}
		ti.remove(idx)
		ti.c.removedBlocks.Add(1)
	}
	ti.publishSize()
}

// AllBlocksCleared drops every block of the target; afterwards the index knows the engine's whole cache
// (it is empty), so unknown parents count as missed events again.
func (ti *TargetIndex) AllBlocksCleared() {
	ti.c.clearedEvents.Add(1)
	ti.reset(true)
	ti.clearedEvent, ti.sinceCleared = true, true
}

// Clear drops every block of the target, e.g. after events were lost. The engine may still hold blocks the
// index no longer knows, so unknown parents are expected and no longer prove missed events until the next
// AllBlocksCleared or MarkSynced. It must be called by the target's writer goroutine.
func (ti *TargetIndex) Clear() {
	ti.reset(false)
}

// MarkSynced records that the index has seen every event since the engine's cache was empty (a publisher
// starting at its first sequence). Writer goroutine only.
func (ti *TargetIndex) MarkSynced() {
	ti.synced = true
}

// takeClearedEvent reports and resets whether an AllBlocksCleared was applied since the last call (and
// since the last Clear).
func (ti *TargetIndex) takeClearedEvent() bool {
	c := ti.clearedEvent
	ti.clearedEvent = false
	return c
}

// emptySinceCleared reports whether the index is empty because of the engine's AllBlocksCleared: nothing
// stored since, and no Clear of the index's own.
func (ti *TargetIndex) emptySinceCleared() bool {
	return ti.sinceCleared
}

// takeMissed reports and resets whether an unknown parent proved missed events.
func (ti *TargetIndex) takeMissed() bool {
	m := ti.missed
	ti.missed = false
	return m
}

func (ti *TargetIndex) reset(synced bool) {
	for idx := ti.lo; idx < ti.hi; idx++ {
		if own := ti.rec(idx).own; own != 0 {
			ti.ix.res.clear(own, ti.bit)
		}
	}
	ti.chunks, ti.spare = nil, nil
	ti.lo, ti.hi, ti.dead = 0, 0, 0
	ti.eng = nil
	ti.engTombs = 0
	ti.dups = nil
	ti.dropped = nil
	ti.droppedN = 0
	ti.n = 0
	ti.synced = synced
	ti.missed = false
	ti.clearedEvent, ti.sinceCleared = false, false
	ti.c.clears.Add(1)
	ti.publishSize()
}

func (ti *TargetIndex) publishSize() {
	ti.blocks.Store(int64(ti.n))
	chunks := len(ti.chunks) - int(ti.lo/recChunk) + len(ti.spare) // the ones before lo's are released
	ti.bytes.Store(int64(chunks*recChunk*16 + cap(ti.eng)*4 + cap(ti.dropped)*8 + len(ti.dups)*24))
}

// insert records that engine block eng with own key own is resident, as the most recent block.
func (ti *TargetIndex) insert(eng, own uint64) {
	ti.reserve()
	if slot, idx, ok := ti.engFind(eng); ok {
		if r := ti.rec(idx); r.own == own {
			// Stored again: it becomes the most recent record.
			if idx != ti.hi-1 {
				r.own = 0
				ti.dead++
				ti.eng[slot] = ti.eng[slot]&^engIdxMask | (ti.push(eng, own) + 1)
				if idx == ti.lo {
					ti.trim()
				}
			}
			return
		}
		// The engine reused a hash for other tokens (a restart we did not see, or a collision).
		ti.c.rekeys.Add(1)
		ti.remove(idx)
	}
	ti.engInsert(ti.push(eng, own))
	ti.n++
	if old := ti.ix.res.set(own, ti.bit); old&ti.bit != 0 {
		if ti.dups == nil {
			ti.dups = make(map[uint64]uint32)
		}
		ti.dups[own]++
	}
	if ti.n > ti.maxBlocks {
		lru := ti.lo // live: trim keeps it so
		ti.drop(ti.rec(lru).eng)
		ti.remove(lru)
		ti.c.evictions.Add(1)
	}
}

// remove forgets record idx and releases its own key.
func (ti *TargetIndex) remove(idx uint32) {
	r := ti.rec(idx)
	ti.engDelete(r.eng)
	own := r.own
	r.own = 0
	ti.dead++
	ti.n--
	if idx == ti.lo {
		ti.trim()
	}
	if c := ti.dups[own]; c > 0 {
		if c == 1 {
			delete(ti.dups, own)
		} else {
			ti.dups[own] = c - 1
		}
		return
	}
	ti.ix.res.clear(own, ti.bit)
}

// push appends a record as the most recent and returns its index. The caller made room (reserve).
func (ti *TargetIndex) push(eng, own uint64) uint32 {
	idx := ti.hi
	if idx%recChunk == 0 {
		var c []rec
		if n := len(ti.spare); n > 0 {
			c, ti.spare[n-1] = ti.spare[n-1], nil
			ti.spare = ti.spare[:n-1]
		} else {
			c = make([]rec, recChunk)
		}
		ti.chunks = append(ti.chunks, c)
	}
	ti.hi++
	*ti.rec(idx) = rec{eng: eng, own: own}
	return idx
}

// trim moves lo past dead records, releasing the chunks it leaves, so that lo is live or equals hi.
func (ti *TargetIndex) trim() {
	for ti.lo < ti.hi && ti.rec(ti.lo).own == 0 {
		ti.lo++
		ti.dead--
		if ti.lo%recChunk == 0 {
			c := &ti.chunks[ti.lo/recChunk-1]
			ti.release(*c)
			*c = nil
		}
	}
}

// reserve makes room for one push. It compacts the slab when dead records outnumber a quarter of the live
// ones (plus a chunk), renumbers the records from 0 when their indexes ran out, and drops released chunks
// from the front of the slab once they are half of it.
func (ti *TargetIndex) reserve() {
	switch {
	case ti.hi == maxRecords:
		ti.renumber()
	case ti.dead > ti.n/4+recChunk:
		ti.compact()
	case ti.lo/recChunk > 0 && ti.lo >= ti.hi/2:
		// Nothing moves: indexes shift by whole chunks.
		first := ti.lo / recChunk
		shift := first * recChunk
		n := copy(ti.chunks, ti.chunks[first:])
		clear(ti.chunks[n:])
		ti.chunks = ti.chunks[:n]
		ti.lo -= shift
		ti.hi -= shift
		for i, v := range ti.eng {
			if v != 0 && v != engTomb {
				ti.eng[i] = v - shift
			}
		}
	}
}

// compact drops the dead records, keeping the order of the others: it moves the live records after the
// first dead one down, or those before the last dead one up, whichever are fewer (an engine that keeps its
// oldest blocks, a system prompt's, leaves its holes right after them), and points their engine-hash slots
// to their new places. There is a dead record (ti.dead > 0).
func (ti *TargetIndex) compact() {
	first, last := ti.lo, ti.hi-1
	for ti.rec(first).own != 0 {
		first++
	}
	for ti.rec(last).own != 0 {
		last--
	}
	if ti.hi-first <= last+1-ti.lo {
		to := first
		for idx := first; idx < ti.hi; idx++ {
			if ti.rec(idx).own != 0 {
				ti.move(idx, to)
				to++
			}
		}
		ti.hi = to
		keep := (to + recChunk - 1) / recChunk
		for i := keep; i < uint32(len(ti.chunks)); i++ {
			ti.release(ti.chunks[i])
			ti.chunks[i] = nil
		}
		ti.chunks = ti.chunks[:keep]
	} else {
		to := last
		for idx := last; idx > ti.lo; idx-- {
			if ti.rec(idx).own != 0 {
				ti.move(idx, to)
				to--
			}
		}
		ti.move(ti.lo, to) // live: trim keeps it so
		for i := ti.lo / recChunk; i < to/recChunk; i++ {
			ti.release(ti.chunks[i])
			ti.chunks[i] = nil
		}
		ti.lo = to
	}
	ti.dead = 0
}

// move moves live record from to index to, a dead record's place, and points its engine-hash slot there.
func (ti *TargetIndex) move(from, to uint32) {
	if from == to {
		return
	}
	r := ti.rec(from)
	slot, _, _ := ti.engFind(r.eng)
	*ti.rec(to) = *r
	ti.eng[slot] = ti.eng[slot]&^engIdxMask | (to + 1)
}

// renumber moves the live records, in order, to the front of the slab (index 0 on), and rebuilds the
// engine-hash table: when the record indexes ran out (maxRecords pushes since the last renumbering).
func (ti *TargetIndex) renumber() {
	first := ti.lo / recChunk
	to := first * recChunk
	for idx := ti.lo; idx < ti.hi; idx++ {
		if r := *ti.rec(idx); r.own != 0 {
			*ti.rec(to) = r
			to++
		}
	}
	n := to - first*recChunk
	keep := (n + recChunk - 1) / recChunk
	for _, c := range ti.chunks[first+keep:] {
		ti.release(c)
	}
	ti.chunks = append(ti.chunks[:0], ti.chunks[first:first+keep]...)
	clear(ti.chunks[keep:cap(ti.chunks)])
	ti.lo, ti.hi, ti.dead = 0, n, 0
	ti.engRebuild(engSlots(ti.n + 1))
}

// release keeps chunk c for reuse while the spare chunks hold fewer records than the dead records
// compact lets accumulate (a quarter of the live ones and a chunk): under churn the slab then cycles
// through the same chunks instead of allocating, at no more memory than it reaches between compactions.
func (ti *TargetIndex) release(c []rec) {
	if len(ti.spare)*recChunk < ti.n/4+2*recChunk {
		ti.spare = append(ti.spare, c)
	}
}

// rec returns record idx of the slab.
func (ti *TargetIndex) rec(idx uint32) *rec {
	return &ti.chunks[idx/recChunk][idx%recChunk]
}

// drop remembers that the index itself forgot engine block eng.
func (ti *TargetIndex) drop(eng uint64) {
	if ti.dropped == nil {
		ti.dropped = make([]uint64, droppedRingSize)
	}
	ti.dropped[ti.droppedN%droppedRingSize] = eng
	ti.droppedN++
}

func (ti *TargetIndex) dropAll(hashes []uint64, salt uint64) {
	for _, h := range hashes {
		ti.drop(h ^ salt)
	}
}

// wasDropped reports whether the index may have dropped eng itself. Once more hashes were dropped than the
// ring remembers, any unknown parent may be one of them.
func (ti *TargetIndex) wasDropped(eng uint64) bool {
	if ti.droppedN > droppedRingSize {
		return true
	}
	for _, h := range ti.dropped[:ti.droppedN] {
		if h == eng {
			return true
		}
	}
	return false
}

// The engine-hash table holds, per slot, 0 (empty), engTomb (deleted) or tag<<24 | (slab index+1), where
// tag is 8 bits of the engine hash: a probe touches the slab (a likely cache miss) only when the tag
// matches, and deletion leaves a tombstone instead of shifting the cluster (which would need every later
// entry's hash, hence its slab record). BenchmarkIngest measured both.
const (
	engIdxBits = 24
	engIdxMask = 1<<engIdxBits - 1
	engTomb    = math.MaxUint32
	// maxRecords keeps slab index+1 below engIdxMask, so no live slot equals engTomb.
	maxRecords = engIdxMask - 2
)

func engTag(h uint64) uint32 {
	return uint32(h&0xff) << engIdxBits
}

// engFind returns the slot and slab index of eng.
func (ti *TargetIndex) engFind(eng uint64) (slot int, idx uint32, ok bool) {
	tab := ti.eng
	if len(tab) == 0 {
		return 0, 0, false
	}
	h := mix.Mix64(eng)
	hi, _ := bits.Mul64(h, uint64(len(tab)))
	i := int(hi)
	tag := engTag(h)
	for {
		v := tab[i]
		if v == 0 {
			return 0, 0, false
		}
		if v != engTomb && v&^engIdxMask == tag {
			if idx := v&engIdxMask - 1; ti.rec(idx).eng == eng {
				return i, idx, true
			}
		}
		i++
		if i == len(tab) {
			i = 0
		}
	}
}

func (ti *TargetIndex) lookup(eng uint64) (uint32, bool) {
	_, idx, ok := ti.engFind(eng)
	return idx, ok
}

// engInsert adds slab index idx (whose engine hash is not in the table) to the table.
func (ti *TargetIndex) engInsert(idx uint32) {
	// Grow (or purge tombstones) at 90% of slots used, back to 80% live: tags keep long probes cheap.
	// 85%/60% took 5.6 bytes per entry at 60k blocks, this 4.5 (BenchmarkIndexMemory;
	// BenchmarkIngest for the more frequent rebuilds).
	if 10*(ti.n+ti.engTombs+1) > 9*len(ti.eng) {
		ti.engRebuild(engSlots(ti.n + 1)) // idx included: it is in the slab
		return
	}
	ti.engPut(idx)
}

func (ti *TargetIndex) engPut(idx uint32) {
	tab := ti.eng
	h := mix.Mix64(ti.rec(idx).eng)
	hi, _ := bits.Mul64(h, uint64(len(tab)))
	i := int(hi)
	for {
		switch tab[i] {
		case 0:
			tab[i] = engTag(h) | (idx + 1)
			return
		case engTomb:
			tab[i] = engTag(h) | (idx + 1)
			ti.engTombs--
			return
		}
		i++
		if i == len(tab) {
			i = 0
		}
	}
}

// engSlots returns the table size for n live records: 80% load.
func engSlots(n int) int {
	return max(16, n*5/4+1)
}

// engRebuild makes the table n slots (or keeps it when it has n to 2n: no allocation when tombstones or
// a compaction make it rebuild at its size) and fills it from the live records, reading the slab in order.
func (ti *TargetIndex) engRebuild(n int) {
	if n <= len(ti.eng) && len(ti.eng) <= 2*n {
		clear(ti.eng)
	} else {
		ti.eng = makeFull[uint32](n)
	}
	ti.engTombs = 0
	for idx := ti.lo; idx < ti.hi; idx++ {
		if ti.rec(idx).own != 0 {
			ti.engPut(idx)
		}
	}
}

// engDelete removes eng, leaving a tombstone that the next insert or rebuild reclaims.
func (ti *TargetIndex) engDelete(eng uint64) {
	if slot, _, ok := ti.engFind(eng); ok {
		ti.eng[slot] = engTomb
		ti.engTombs++
	}
}
