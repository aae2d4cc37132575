package kvindex

import (
	"encoding/binary"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/rolter-ai/rolter/internal/mix"
)

var gpu = []byte("GPU")

func storedEv(hashes []uint64, parent uint64, tokens []uint32, bs int) *BlockStored {
	return &BlockStored{Hashes: hashes, Parent: parent, HasParent: parent != 0, Tokens: tokens, BlockSize: bs, Medium: gpu}
}

func removedEv(hashes ...uint64) *BlockRemoved {
	return &BlockRemoved{Hashes: hashes, Medium: gpu}
}

func matchAll(ix *Index, tokens []uint32, n int) ([]int, int) {
	out := make([]int, n)
	var s Scratch
	full := ix.Match(tokens, &s, out)
	return out, full
}

func checkMatch(t *testing.T, ix *Index, tokens []uint32, want ...int) {
	t.Helper()
	got, _ := matchAll(ix, tokens, len(want))
	if !slices.Equal(got, want) {
		t.Fatalf("unexpected match for %d tokens: got %v; want %v", len(tokens), got, want)
	}
}

func TestIndexStoreAndMatch(t *testing.T) {
	ix := NewIndex(4)
	t0 := ix.Target(0, 0)
	if ix.Target(0, 5) != t0 {
		t.Fatalf("Target must return the same handle")
	}
	t0.BlockStored(storedEv([]uint64{101, 102}, 0, seqRange(1, 32), 16))
	t0.BlockStored(storedEv([]uint64{103, 104}, 102, seqRange(33, 64), 16))
	if t0.Blocks() != 4 || t0.BlockSize() != 16 {
		t.Fatalf("unexpected blocks=%d bs=%d", t0.Blocks(), t0.BlockSize())
	}

	f := func(tokens []uint32, wantFull int, want ...int) {
		t.Helper()
		got, full := matchAll(ix, tokens, len(want))
		if full != wantFull || !slices.Equal(got, want) {
			t.Fatalf("unexpected match: got %v full=%d; want %v full=%d", got, full, want, wantFull)
		}
	}
	f(seqRange(1, 70), 4, 4, 0, 0, 0)
	f(seqRange(1, 64), 4, 4)
	f(seqRange(1, 63), 3, 3)                                   // the partial last block does not count
	f(append(seqRange(1, 32), seqRange(100, 131)...), 4, 2, 0) // diverges in block 3
	f(append([]uint32{0}, seqRange(2, 64)...), 4, 0, 0)        // diverges in block 1
	f(nil, 0, 0, 0)
	f(seqRange(1, 64), 4) // no outputs at all

	// A request whose prefix is the stored chain, cut at a block boundary, matches its full length.
	f(seqRange(1, 48), 3, 3)
}

func TestIndexRemove(t *testing.T) {
	ix := NewIndex(1)
	t0 := ix.Target(0, 0)
	t0.BlockStored(storedEv([]uint64{1, 2, 3, 4}, 0, seqRange(1, 8), 2))
	t0.BlockRemoved(removedEv(3))
	checkMatch(t, ix, seqRange(1, 8), 2)
	t0.BlockRemoved(removedEv(1, 77))
	checkMatch(t, ix, seqRange(1, 8), 0)
	st := t0.Stats()
	if st.Blocks != 2 || st.RemovedBlocks != 2 || st.UnknownRemoves != 1 || st.RemovedEvents != 2 {
		t.Fatalf("unexpected stats %+v", st)
	}
	// Removing through a non-GPU medium does not touch GPU residency.
	t0.BlockRemoved(&BlockRemoved{Hashes: []uint64{2}, Medium: []byte("CPU")})
	if t0.Blocks() != 2 {
		t.Fatalf("a CPU removal dropped a GPU block")
	}
}

func TestIndexAllBlocksCleared(t *testing.T) {
	ix := NewIndex(2)
	t0, t1 := ix.Target(0, 0), ix.Target(1, 0)
	t0.BlockStored(storedEv([]uint64{1, 2}, 0, seqRange(1, 4), 2))
	t1.BlockStored(storedEv([]uint64{9, 8}, 0, seqRange(1, 4), 2))
	checkMatch(t, ix, seqRange(1, 4), 2, 2)
	t0.AllBlocksCleared()
	checkMatch(t, ix, seqRange(1, 4), 0, 2)
	if t0.Blocks() != 0 || t0.Stats().ClearedEvents != 1 {
		t.Fatalf("unexpected stats %+v", t0.Stats())
	}
	t1.Clear()
	checkMatch(t, ix, seqRange(1, 4), 0, 0)
	if keys, _ := ix.Stats(); keys != 0 {
		t.Fatalf("shared table still has %d keys", keys)
	}
	// The cleared target is usable again.
	t0.BlockStored(storedEv([]uint64{1}, 0, seqRange(1, 2), 2))
	checkMatch(t, ix, seqRange(1, 4), 1, 0)
}

func TestIndexLRU(t *testing.T) {
	ix := NewIndex(1)
	t0 := ix.Target(0, 3)
	block := func(i uint32) []uint32 { return []uint32{i, i} }
	for i := uint32(1); i <= 5; i++ {
		t0.BlockStored(storedEv([]uint64{uint64(i)}, 0, block(i), 2))
	}
	f := func(i uint32, want int) {
		t.Helper()
		checkMatch(t, ix, block(i), want)
	}
	f(1, 0)
	f(2, 0)
	f(3, 1)
	f(4, 1)
	f(5, 1)
	if st := t0.Stats(); st.Blocks != 3 || st.Evictions != 2 {
		t.Fatalf("unexpected stats %+v", st)
	}
	// Storing block 3 again makes it the most recent, so block 4 goes next.
	t0.BlockStored(storedEv([]uint64{3}, 0, block(3), 2))
	t0.BlockStored(storedEv([]uint64{6}, 0, block(6), 2))
	f(3, 1)
	f(4, 0)
	f(6, 1)
	// A chain longer than the cap keeps its newest blocks.
	t0.BlockStored(storedEv([]uint64{10, 11, 12, 13}, 0, seqRange(20, 27), 2))
	if t0.Blocks() != 3 {
		t.Fatalf("unexpected blocks %d", t0.Blocks())
	}
	checkMatch(t, ix, seqRange(20, 27), 0) // block 10 (the first) was evicted
}

func TestIndexUnknownParent(t *testing.T) {
	ix := NewIndex(1)
	t0 := ix.Target(0, 2)
	// Not synced (a late joiner): unknown parents are expected, counted and not applied.
	t0.BlockStored(storedEv([]uint64{5}, 999, seqRange(1, 2), 2))
	if st := t0.Stats(); st.UnknownParents != 1 || st.Blocks != 0 || t0.takeMissed() {
		t.Fatalf("unexpected stats %+v", st)
	}
	// Synced: an unknown parent proves missed events.
	t0.MarkSynced()
	t0.BlockStored(storedEv([]uint64{6}, 998, seqRange(1, 2), 2))
	if !t0.takeMissed() {
		t.Fatalf("an unknown parent on a synced target must be reported")
	}
	if t0.takeMissed() {
		t.Fatalf("takeMissed must reset")
	}
	// A child of a block that was itself dropped as an unknown-parent child is not reported again.
	t0.BlockStored(storedEv([]uint64{7}, 6, seqRange(3, 4), 2))
	if t0.takeMissed() {
		t.Fatalf("a child of a dropped block must not be reported")
	}
	// A parent evicted by the index's own cap is not reported either.
	t0.BlockStored(storedEv([]uint64{1}, 0, []uint32{1, 1}, 2))
	t0.BlockStored(storedEv([]uint64{2}, 0, []uint32{2, 2}, 2))
	t0.BlockStored(storedEv([]uint64{3}, 0, []uint32{3, 3}, 2)) // evicts 1
	t0.BlockStored(storedEv([]uint64{4}, 1, []uint32{4, 4}, 2))
	if t0.takeMissed() {
		t.Fatalf("a parent evicted by the cap must not be reported")
	}
	if st := t0.Stats(); st.UnknownParents != 4 {
		t.Fatalf("unexpected stats %+v", st)
	}
	// Clear (events lost) stops reporting; AllBlocksCleared (engine empty) resumes it.
	t0.Clear()
	t0.BlockStored(storedEv([]uint64{8}, 997, seqRange(1, 2), 2))
	if t0.takeMissed() {
		t.Fatalf("after Clear unknown parents are expected")
	}
	t0.AllBlocksCleared()
	t0.BlockStored(storedEv([]uint64{8}, 996, seqRange(1, 2), 2))
	if !t0.takeMissed() {
		t.Fatalf("after AllBlocksCleared unknown parents prove missed events")
	}
}

func TestIndexMedium(t *testing.T) {
	ix := NewIndex(1)
	t0 := ix.Target(0, 0)
	f := func(medium []byte, wantBlocks int) {
		t.Helper()
		t0.Clear()
		ev := storedEv([]uint64{1}, 0, seqRange(1, 2), 2)
		ev.Medium = medium
		t0.BlockStored(ev)
		if t0.Blocks() != wantBlocks {
			t.Fatalf("medium %q: got %d blocks; want %d", medium, t0.Blocks(), wantBlocks)
		}
		checkMatch(t, ix, seqRange(1, 2), wantBlocks)
	}
	f(nil, 1)
	f([]byte("GPU"), 1)
	f([]byte("gpu"), 1)
	f([]byte("CPU"), 0)
	f([]byte("STORAGE"), 0)
	f([]byte(""), 0)
	if st := t0.Stats(); st.NonGPU != 3 {
		t.Fatalf("unexpected stats %+v", st)
	}
}

func TestIndexTwoTargetsOverlap(t *testing.T) {
	ix := NewIndex(3)
	t0, t1 := ix.Target(0, 0), ix.Target(1, 0)
	ix.Target(2, 0)
	// Engine hashes differ per engine (random NONE_HASH), own keys do not.
	t0.BlockStored(storedEv([]uint64{1, 2, 3, 4}, 0, seqRange(1, 8), 2))
	t1.BlockStored(storedEv([]uint64{11, 12}, 0, seqRange(1, 4), 2))
	checkMatch(t, ix, seqRange(1, 10), 4, 2, 0)
	if keys, _ := ix.Stats(); keys != 4 {
		t.Fatalf("overlapping blocks must share keys: %d keys", keys)
	}
	t1.BlockRemoved(removedEv(11))
	checkMatch(t, ix, seqRange(1, 10), 4, 0, 0)
	// Target 1 extends from its remaining block; target 0 is unaffected.
	t1.BlockStored(storedEv([]uint64{13}, 12, seqRange(5, 6), 2))
	t1.BlockStored(storedEv([]uint64{11}, 0, seqRange(1, 2), 2))
	checkMatch(t, ix, seqRange(1, 10), 4, 3, 0)
	t0.Clear()
	checkMatch(t, ix, seqRange(1, 10), 0, 3, 0)
}

func TestIndexDuplicateOwnKeys(t *testing.T) {
	ix := NewIndex(1)
	t0 := ix.Target(0, 0)
	// The same tokens under two engine hashes (cache_salt, LoRA): the bit stays until the last goes.
	t0.BlockStored(storedEv([]uint64{1}, 0, seqRange(1, 2), 2))
	t0.BlockStored(storedEv([]uint64{2}, 0, seqRange(1, 2), 2))
	t0.BlockRemoved(removedEv(1))
	checkMatch(t, ix, seqRange(1, 2), 1)
	t0.BlockRemoved(removedEv(2))
	checkMatch(t, ix, seqRange(1, 2), 0)
	if keys, _ := ix.Stats(); keys != 0 {
		t.Fatalf("unexpected keys %d", keys)
	}
}

func TestIndexBlockSizes(t *testing.T) {
	ix := NewIndex(2)
	t0, t1 := ix.Target(0, 0), ix.Target(1, 0)
	if ix.BlockSize(1) != DefaultBlockSize {
		t.Fatalf("unexpected default block size %d", ix.BlockSize(1))
	}
	t0.BlockStored(storedEv([]uint64{1, 2}, 0, seqRange(1, 32), 16))
	t1.BlockStored(storedEv([]uint64{5, 6, 7, 8}, 0, seqRange(1, 32), 8))
	out, full := matchAll(ix, seqRange(1, 40), 2)
	if !reflect.DeepEqual(out, []int{2, 4}) || full != 5 {
		t.Fatalf("unexpected match %v full=%d", out, full)
	}
	// A second block size while blocks are resident is not applied.
	t1.BlockStored(storedEv([]uint64{9}, 0, seqRange(1, 16), 16))
	if st := t1.Stats(); st.BlockSizeMismatches != 1 || st.Blocks != 4 || st.BlockSize != 8 {
		t.Fatalf("unexpected stats %+v", st)
	}
	// After a clear the target learns again.
	t1.Clear()
	t1.BlockStored(storedEv([]uint64{9}, 0, seqRange(1, 16), 16))
	checkMatch(t, ix, seqRange(1, 40), 2, 1)
}

func TestIndexBadEvents(t *testing.T) {
	ix := NewIndex(1)
	t0 := ix.Target(0, 0)
	t0.MarkSynced()
	t0.BlockStored(storedEv([]uint64{1, 2}, 0, seqRange(1, 3), 2)) // 3 tokens for 2 blocks of 2
	t0.BlockStored(storedEv([]uint64{3}, 0, nil, 0))               // offload placeholder shape
	t0.BlockStored(storedEv(nil, 0, nil, 16))
	// A child of a block that could not be indexed is not proof of missed events.
	t0.BlockStored(storedEv([]uint64{4}, 2, seqRange(5, 6), 2))
	st := t0.Stats()
	if st.TokenMismatches != 2 || st.Blocks != 0 || st.UnknownParents != 1 || t0.takeMissed() {
		t.Fatalf("unexpected stats %+v", st)
	}
	// An engine hash stored again with other tokens replaces the old record.
	t0.BlockStored(storedEv([]uint64{7}, 0, seqRange(1, 2), 2))
	t0.BlockStored(storedEv([]uint64{7}, 0, seqRange(3, 4), 2))
	checkMatch(t, ix, seqRange(1, 2), 0)
	checkMatch(t, ix, seqRange(3, 4), 1)
	if st := t0.Stats(); st.Rekeys != 1 || st.Blocks != 1 {
		t.Fatalf("unexpected stats %+v", st)
	}
}

func TestIndexGroups(t *testing.T) {
	ix := NewIndex(1)
	t0 := ix.Target(0, 0)
	// The same engine hash in two KV cache groups names two blocks.
	g1 := storedEv([]uint64{5}, 0, seqRange(1, 2), 2)
	g1.GroupIdx, g1.HasGroupIdx = 1, true
	t0.BlockStored(g1)
	t0.BlockStored(storedEv([]uint64{5}, 0, seqRange(3, 4), 2))
	if st := t0.Stats(); st.Blocks != 2 || st.Rekeys != 0 {
		t.Fatalf("unexpected stats %+v", st)
	}
	t0.BlockRemoved(&BlockRemoved{Hashes: []uint64{5}, Medium: gpu, GroupIdx: 1, HasGroupIdx: true})
	checkMatch(t, ix, seqRange(1, 2), 0)
	checkMatch(t, ix, seqRange(3, 4), 1)
}

// TestIndexModel drives random events into the index and into a naive model (maps and an LRU list per
// target) and compares Match, Blocks and the shared key count after every step.
func TestIndexModel(t *testing.T) {
	const (
		nTargets  = 5
		bs        = 4
		seqBlocks = 8
	)
	// Caps per target: 0 = none (the engine-hash table must grow), small ones evict often.
	caps := []int{12, 0, 30, 5, 12}
	rng := rand.New(rand.NewPCG(7, 11))
	// Token sequences sharing prefixes (3 roots, each with branches), so targets overlap.
	var seqs [][]uint32
	for root := 0; root < 3; root++ {
		base := make([]uint32, seqBlocks*bs)
		for i := range base {
			base[i] = uint32(rng.IntN(3))
		}
		for br := 0; br < 3; br++ {
			s := append([]uint32(nil), base...)
			cut := rng.IntN(seqBlocks) * bs
			for i := cut; i < len(s); i++ {
				s[i] = uint32(rng.IntN(3))
			}
			seqs = append(seqs, s)
		}
	}
	refKey := func(parent uint64, block []uint32) uint64 {
		buf := binary.LittleEndian.AppendUint64(nil, parent)
		for _, tok := range block {
			buf = binary.LittleEndian.AppendUint32(buf, tok)
		}
		k := xxhash.Sum64(buf)
		if k == 0 {
			k = 1
		}
		return k
	}
	seqKeys := make([][]uint64, len(seqs))
	for i, s := range seqs {
		p := RootKey
		for b := 0; b < seqBlocks; b++ {
			p = refKey(p, s[b*bs:(b+1)*bs])
			seqKeys[i] = append(seqKeys[i], p)
		}
	}

	type model struct {
		own   map[uint64]uint64 // eng -> own
		lru   []uint64          // eng, most recent first
		count map[uint64]int    // own -> records
	}
	models := make([]*model, nTargets)
	ix := NewIndex(nTargets)
	tis := make([]*TargetIndex, nTargets)
	for i := range models {
		models[i] = &model{own: map[uint64]uint64{}, count: map[uint64]int{}}
		tis[i] = ix.Target(i, caps[i])
	}
	engOf := func(tg int, own uint64) uint64 { return mix.Mix64(own ^ uint64(tg+1)*0x1234567) }
	forget := func(m *model, eng uint64) {
		own := m.own[eng]
		delete(m.own, eng)
		if m.count[own]--; m.count[own] == 0 {
			delete(m.count, own)
		}
		for i, e := range m.lru {
			if e == eng {
				m.lru = append(m.lru[:i], m.lru[i+1:]...)
				break
			}
		}
	}
	insert := func(m *model, maxBlocks int, eng, own uint64) {
		if old, ok := m.own[eng]; ok && old == own {
			forget(m, eng) // re-inserted below as most recent
		} else if ok {
			forget(m, eng)
		}
		m.own[eng] = own
		m.count[own]++
		m.lru = append([]uint64{eng}, m.lru...)
		if maxBlocks > 0 && len(m.lru) > maxBlocks {
			forget(m, m.lru[len(m.lru)-1])
		}
	}

	for step := 0; step < 4000; step++ {
		tg := rng.IntN(nTargets)
		m, ti := models[tg], tis[tg]
		switch op := rng.IntN(20); {
		case op < 12:
			// Store blocks [from, to) of a sequence; from > 0 needs the parent resident (else the index
			// must skip the event, as the model does).
			si := rng.IntN(len(seqs))
			from := rng.IntN(seqBlocks)
			if rng.IntN(3) == 0 {
				from = 0
			}
			to := from + 1 + rng.IntN(seqBlocks-from)
			var parent uint64
			if from > 0 {
				parent = engOf(tg, seqKeys[si][from-1])
			}
			hashes := make([]uint64, 0, to-from)
			for b := from; b < to; b++ {
				hashes = append(hashes, engOf(tg, seqKeys[si][b]))
			}
			ti.BlockStored(storedEv(hashes, parent, seqs[si][from*bs:to*bs], bs))
			if _, ok := m.own[parent]; from == 0 || ok {
				for b := from; b < to; b++ {
					insert(m, caps[tg], engOf(tg, seqKeys[si][b]), seqKeys[si][b])
				}
			}
		case op < 18:
			var eng uint64 = 12345 // unknown
			if len(m.lru) > 0 && rng.IntN(5) > 0 {
				eng = m.lru[rng.IntN(len(m.lru))]
			}
			ti.BlockRemoved(removedEv(eng))
			if _, ok := m.own[eng]; ok {
				forget(m, eng)
			}
		case op < 19:
			ti.Clear()
			*m = model{own: map[uint64]uint64{}, count: map[uint64]int{}}
		default:
			ti.AllBlocksCleared()
			*m = model{own: map[uint64]uint64{}, count: map[uint64]int{}}
		}
		ti.takeMissed()

		// Compare.
		distinct := map[uint64]bool{}
		for i, mm := range models {
			if tis[i].Blocks() != len(mm.own) {
				t.Fatalf("step %d target %d: index has %d blocks; model %d", step, i, tis[i].Blocks(), len(mm.own))
			}
			for own := range mm.count {
				distinct[own] = true
			}
		}
		if keys, _ := ix.Stats(); keys != len(distinct) {
			t.Fatalf("step %d: shared table has %d keys; model %d", step, keys, len(distinct))
		}
		for si, s := range seqs {
			got, _ := matchAll(ix, s, nTargets)
			for i, mm := range models {
				want := 0
				for want < seqBlocks && mm.count[seqKeys[si][want]] > 0 {
					want++
				}
				if got[i] != want {
					t.Fatalf("step %d seq %d target %d: Match %d; model %d", step, si, i, got[i], want)
				}
			}
		}
	}
}

// checkSlab checks the invariants of ti's record slab (see TargetIndex.chunks) and engine-hash table.
func checkSlab(t *testing.T, ti *TargetIndex) {
	t.Helper()
	if want := int((ti.hi + recChunk - 1) / recChunk); len(ti.chunks) != want {
		t.Fatalf("%d chunks for %d records; want %d", len(ti.chunks), ti.hi, want)
	}
	for i, c := range ti.chunks {
		if released := i < int(ti.lo/recChunk); released != (c == nil) {
			t.Fatalf("chunk %d (lo %d): released %v, nil %v", i, ti.lo, released, c == nil)
		}
	}
	if ti.lo > ti.hi || ti.lo < ti.hi && ti.rec(ti.lo).own == 0 {
		t.Fatalf("lo %d (hi %d) is not live", ti.lo, ti.hi)
	}
	live := 0
	for idx := ti.lo; idx < ti.hi; idx++ {
		r := ti.rec(idx)
		if r.own == 0 {
			continue
		}
		live++
		if got, ok := ti.lookup(r.eng); !ok || got != idx {
			t.Fatalf("engine hash %x of record %d: lookup %d, %v", r.eng, idx, got, ok)
		}
	}
	slots := 0
	for _, v := range ti.eng {
		if v != 0 && v != engTomb {
			slots++
		}
	}
	if live != ti.n || slots != ti.n || ti.dead != int(ti.hi-ti.lo)-ti.n {
		t.Fatalf("%d live records, %d table entries, %d dead in [%d, %d); n %d", live, slots, ti.dead, ti.lo, ti.hi, ti.n)
	}
}

// TestIndexSlab stores, stores again, re-keys and removes single blocks at random on one capped target, for
// long enough that the slab releases chunks, renumbers and compacts many times, and compares the records,
// their LRU order and the shared table with a model after every step.
func TestIndexSlab(t *testing.T) {
	const maxBlocks = 3000
	ix := NewIndex(1)
	ti := ix.Target(0, maxBlocks)
	rng := rand.New(rand.NewPCG(17, 19))
	tokens := func(id uint32) []uint32 { return []uint32{id, id} }
	own := func(id uint32) uint64 { return BlockKeys(nil, tokens(id), 2)[0] }
	var lru []uint64             // engine hashes, least recent first
	block := map[uint64]uint32{} // engine hash -> token id
	forget := func(eng uint64) {
		i := slices.Index(lru, eng)
		lru = slices.Delete(lru, i, i+1)
		delete(block, eng)
	}
	store := func(eng uint64, id uint32) {
		ti.BlockStored(storedEv([]uint64{eng}, 0, tokens(id), 2))
		if _, ok := block[eng]; ok {
			forget(eng)
		}
		lru = append(lru, eng)
		block[eng] = id
		if len(lru) > maxBlocks {
			forget(lru[0])
		}
	}
	nextEng, nextID := uint64(1), uint32(1)
	compactions := 0
	for step := 0; step < 60000; step++ {
		if ti.dead > ti.n/4+recChunk {
			compactions++ // at the next store
		}
		// Phases: grow with few removals; churn with many; the engine evicting its oldest blocks (the slab's
		// front is released and the records renumbered without compaction); the engine removing recent
		// blocks (compaction moves the few records after them down, where the others move the records
		// before them up).
		phase := step / 5000 % 4
		stored := true
		switch op := rng.IntN(10); {
		case phase == 2 && op < 5 && len(lru) > 0:
			ti.BlockRemoved(removedEv(lru[0]))
			forget(lru[0])
			stored = false
		case phase == 3 && op < 5 && len(lru) > 0:
			eng := lru[len(lru)-1-rng.IntN((len(lru)+9)/10)]
			ti.BlockRemoved(removedEv(eng))
			forget(eng)
			stored = false
		case op < 4 || len(lru) == 0 || phase == 2:
			store(nextEng, nextID)
			nextEng++
			nextID++
		case op < 6:
			eng := lru[rng.IntN(len(lru))]
			store(eng, block[eng]) // stored again: most recent
		case op < 7:
			store(lru[rng.IntN(len(lru))], nextID) // the engine reused a hash
			nextID++
		case phase == 1 || op < 8:
			eng := lru[rng.IntN(len(lru))]
			ti.BlockRemoved(removedEv(eng))
			forget(eng)
			stored = false
		default:
			stored = false
		}
		if ti.Blocks() != len(lru) {
			t.Fatalf("step %d: %d blocks; model %d", step, ti.Blocks(), len(lru))
		}
		// A store compacts first when dead records outnumber a quarter of the live ones and a chunk; then it
		// leaves at most 2 more (re-keyed or stored again, and evicted) and one live record less.
		if span := int(ti.hi - ti.lo); stored && span > ti.n+(ti.n+1)/4+recChunk+3 {
			t.Fatalf("step %d: %d records for %d live ones", step, span, ti.n)
		}
		if step%1000 != 999 {
			continue
		}
		if step%3000 == 999 {
			ti.renumber() // what a push does when record indexes run out (maxRecords)
		}
		checkSlab(t, ti)
		i := 0
		for idx := ti.lo; idx < ti.hi; idx++ {
			if r := ti.rec(idx); r.own != 0 {
				if r.eng != lru[i] || r.own != own(block[lru[i]]) {
					t.Fatalf("step %d: record %d is %x/%x; model %x/%x", step, idx, r.eng, r.own, lru[i], own(block[lru[i]]))
				}
				i++
			}
		}
		for _, eng := range lru {
			if ix.res.get(own(block[eng])) != 1 {
				t.Fatalf("step %d: block %x is not in the shared table", step, eng)
			}
		}
		if keys, _ := ix.Stats(); keys != len(lru) {
			t.Fatalf("step %d: %d keys in the shared table; model %d", step, keys, len(lru))
		}
	}
	if nextEng < 10*recChunk || compactions < 5 {
		t.Fatalf("the test did not exercise the slab: %d blocks stored, %d compactions", nextEng, compactions)
	}
}
