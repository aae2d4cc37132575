package kvindex

import (
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
)

// residency maps own block keys to a bitmask of the targets holding the block on the GPU.
//
// It is a sharded open-addressing table with linear probing over 16-byte cells of two 8-byte words, and no
// per-entry allocation: a generic concurrent map (xsync MapOf) allocates one 16-byte entry per write and
// costs several times the memory per key (BenchmarkResidencyMemory compares both).
//
// A word is empty (0), a key word or a mask word. A key word holds the key's low 56 bits (the shard, chosen
// by the top 8, implies the others) and an 8-bit tag: one holder (the target's number + 1), no holder
// (tagNone), or several (tagMulti), whose mask fills the other word of the key's cell. So a key one target
// holds costs one word, the common case when targets hold distinct blocks, and a shared one a cell, as the
// 16-byte (key, mask) slots this replaces did (half the table's bytes per key when nothing is
// shared, BenchmarkIndexMemory). A mask word carries maskMark (bit 7, which no key word's tag has, so a
// probe never takes a mask for a key); mask bit 7 lives in the key word's tag instead.
//
// Readers take no locks and never see a torn entry. A key word with one holder is its whole entry, read in
// one load. A key word turns to tagMulti only after its mask word was stored, and stays so, with its key,
// until the shard's array is rebuilt and swapped whole: a reader that finds it reads that key's current
// mask next to it, loaded after it (each target's bit in one load). Words never become empty: probing ends
// at the first empty word, which the load kept below residencyGrowLoad guarantees. A key word without
// holder may be taken by another key on its path: the one load that reads it reads its key too. When a
// key gains a second holder while the other word of its cell holds another key, that key is first copied
// to the first free word after the cell (on its probe path: no empty word comes before it), then its old
// word becomes the mask: a reader meets it in one place or the other. Writers lock one shard.
type residency struct {
	shards [residencyShards]residencyShard
}

const (
	residencyShardBits = 8
	residencyShards    = 1 << residencyShardBits
	// 256 bytes per shard at least, as the 16 slots of the old table: small indexes keep a low load
	// (BenchmarkMatch2k16Targets).
	residencyMinWords = 32
	// The word array is rebuilt when more than residencyGrowLoad of its words are used (zombies included),
	// to residencyRebuildLoad of the live words: 1.1 to 1.25 words per key, more where the allocator rounds
	// an array up (makeFull puts the rounding to use). Cells of two words keep probes short at these loads:
	// a hit reads 1.9 cells on average at 80% and 3 at 90%, a miss (the last block of a Match) 7 and 22 (a
	// simulation; at the old table's 60% and 80%, its 16-byte slots took 1.8 and 3 slots for a hit, 3.6 and
	// 13 for a miss). BenchmarkMatchLargeIndex measures a table at its working load.
	residencyGrowLoad    = 0.90
	residencyRebuildLoad = 0.80
)

// Word tags (the low residencyShardBits bits of a key word).
const (
	tagMask  = 1<<residencyShardBits - 1
	tagNone  = MaxTargets + 1 // a key without holder: the word is free for another key
	tagMulti = MaxTargets + 2 // several holders, mask in the other word; bit 0 carries mask bit 7
	maskMark = 1 << 7
)

type residencyShard struct {
	mu   sync.Mutex
	tab  atomic.Pointer[wordArray]
	used int // non-empty words; guarded by mu
	live atomic.Int64
	_    [32]byte // keeps two shards' locks off one cache line
}

type wordArray struct {
	w     []atomic.Uint64 // even length: cell i is w[2i], w[2i+1]
	limit int             // used words that trigger a rebuild
}

// keyBits returns the key word of key without its tag.
func keyBits(key uint64) uint64 {
	return key << residencyShardBits
}

// isKeyWord reports whether w is the key word of kb (keyBits of a key): its tag, w^kb, is in 1..127.
func isKeyWord(w, kb uint64) bool {
	return w^kb-1 < maskMark-1
}

// home returns the first word of the cell where the probe for kb starts, in an array of n words.
func home(kb uint64, n int) int {
	hi, _ := bits.Mul64(kb, uint64(n/2))
	return int(hi) * 2
}

// maskOf returns the mask of key word w, whose cell's other word is other (read after w).
func maskOf(w, other uint64) uint64 {
	switch tag := w & tagMask; {
	case tag <= MaxTargets:
		return 1 << ((tag - 1) & 63) // tag >= 1 (isKeyWord): & 63 only spares the shift's range check
	case tag == tagNone:
		return 0
	default:
		return other&^maskMark | (tag&1)<<7
	}
}

// multiWords returns the key word of kb with several holders and its mask word for mask.
func multiWords(kb, mask uint64) (key, maskWord uint64) {
	return kb | tagMulti | mask>>7&1, mask | maskMark
}

// get returns the mask of key (0 when absent). It is safe for concurrent use and never blocks.
func (r *residency) get(key uint64) uint64 {
	t := r.shards[key>>(64-residencyShardBits)].tab.Load()
	if t == nil {
		return 0
	}
	w := t.w
	kb := keyBits(key)
	for i := home(kb, len(w)); ; {
		c := (*[2]atomic.Uint64)(w[i : i+2])
		a := c[0].Load()
		b := c[1].Load()
		if isKeyWord(a, kb) {
			return maskOf(a, b) // b, loaded after a, holds the mask stored before a's tag
		}
		if isKeyWord(b, kb) {
			return maskOf(b, c[0].Load()) // a was loaded before b: load it again
		}
		if a == 0 || b == 0 {
			return 0
		}
		if i += 2; i == len(w) {
			i = 0
		}
	}
}

// locate returns the word of kb (found) or else the first free word on its path: an empty word or a key
// word without holder. Called with the shard's lock held.
func (t *wordArray) locate(kb uint64) (i int, found bool) {
	w := t.w
	free := -1
	for i = home(kb, len(w)); ; {
		v := w[i].Load()
		if v == 0 {
			if free < 0 {
				free = i
			}
			return free, false
		}
		if isKeyWord(v, kb) {
			return i, true
		}
		if free < 0 && v&tagMask == tagNone {
			free = i
		}
		if i++; i == len(w) {
			i = 0
		}
	}
}

// set ORs bit (exactly one target's) into the mask of key and returns the previous mask.
func (r *residency) set(key, bit uint64) uint64 {
	sh := &r.shards[key>>(64-residencyShardBits)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.tab.Load()
	// A set takes one word at most: a new key's, a mask's, or the one a moved key takes.
	if t == nil || sh.used+1 > t.limit {
		t = sh.rebuild(t)
	}
	w := t.w
	kb := keyBits(key)
	i, found := t.locate(kb)
	if !found {
		if w[i].Load() == 0 {
			sh.used++
		}
		w[i].Store(kb | uint64(bits.TrailingZeros64(bit)+1))
		sh.live.Add(1)
		return 0
	}
	v := w[i].Load()
	old := maskOf(v, w[i^1].Load())
	if old&bit != 0 {
		return old
	}
	if old == 0 {
		sh.live.Add(1)
	}
	switch tag := v & tagMask; {
	case tag == tagNone:
		w[i].Store(kb | uint64(bits.TrailingZeros64(bit)+1))
	case tag <= MaxTargets:
		// A second holder: the key takes its whole cell, the other word becoming its mask.
		o := i ^ 1
		switch ov := w[o].Load(); {
		case ov == 0:
			sh.used++
		case ov&tagMask == tagNone:
		case ov&maskMark != 0 || ov&tagMask > MaxTargets:
			panic(fmt.Errorf("BUG: word %x shares a cell with the one-holder key word %x", ov, v))
		default:
			sh.move(t, o)
		}
		kw, mw := multiWords(kb, old|bit)
		w[o].Store(mw)
		w[i].Store(kw)
	default:
		if bit == maskMark {
			w[i].Store(v | 1)
		} else {
			w[i^1].Store(w[i^1].Load() | bit)
		}
	}
	return old
}

// move copies the key word at i to the first free word after its cell; the caller then overwrites i.
// Every word from the key's home to the new one is in use, so probes still reach it. Called with sh.mu held.
func (sh *residencyShard) move(t *wordArray, i int) {
	w := t.w
	j := i | 1
	for {
		if j++; j == len(w) {
			j = 0
		}
		v := w[j].Load()
		if v == 0 {
			sh.used++
			break
		}
		if v&tagMask == tagNone {
			break
		}
	}
	w[j].Store(w[i].Load())
}

// clear removes bit (one target's) from the mask of key and returns the previous mask.
func (r *residency) clear(key, bit uint64) uint64 {
	sh := &r.shards[key>>(64-residencyShardBits)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.tab.Load()
	if t == nil {
		return 0
	}
	w := t.w
	kb := keyBits(key)
	i, found := t.locate(kb)
	if !found {
		return 0
	}
	v := w[i].Load()
	old := maskOf(v, w[i^1].Load())
	if old&bit == 0 {
		return old
	}
	switch {
	case v&tagMask <= MaxTargets:
		w[i].Store(kb | tagNone)
	case bit == maskMark:
		w[i].Store(v &^ 1)
	default:
		w[i^1].Store(w[i^1].Load() &^ bit)
	}
	if old == bit {
		sh.live.Add(-1)
	}
	return old
}

// rebuild lays the live keys of t out in a new array sized for residencyRebuildLoad and publishes it:
// keys with several holders first, each in a cell of its own, then the others. Readers still walking t
// see a consistent, slightly stale view. Called with sh.mu held.
func (sh *residencyShard) rebuild(t *wordArray) *wordArray {
	need := 0
	if t != nil {
		for i := range t.w {
			if v := t.w[i].Load(); v != 0 && v&maskMark == 0 {
				need += min(bits.OnesCount64(maskOf(v, t.w[i^1].Load())), 2)
			}
		}
	}
	nt := &wordArray{w: makeFull[atomic.Uint64](max(residencyMinWords, int(float64(need)/residencyRebuildLoad)+2))}
	nt.w = nt.w[:len(nt.w)&^1]
	nt.limit = int(float64(len(nt.w)) * residencyGrowLoad)
	if t != nil {
		for pass := 0; pass < 2; pass++ {
			for i := range t.w {
				v := t.w[i].Load()
				if v == 0 || v&maskMark != 0 {
					continue
				}
				m := maskOf(v, t.w[i^1].Load())
				kb := v &^ tagMask
				switch n := bits.OnesCount64(m); {
				case pass == 0 && n > 1:
					j := home(kb, len(nt.w))
					for nt.w[j].Load() != 0 {
						if j += 2; j == len(nt.w) {
							j = 0
						}
					}
					kw, mw := multiWords(kb, m)
					nt.w[j].Store(kw)
					nt.w[j+1].Store(mw)
				case pass == 1 && n == 1:
					j := home(kb, len(nt.w))
					for nt.w[j].Load() != 0 {
						if j++; j == len(nt.w) {
							j = 0
						}
					}
					nt.w[j].Store(kb | uint64(bits.TrailingZeros64(m)+1))
				}
			}
		}
	}
	sh.used = need
	sh.tab.Store(nt)
	return nt
}

// stats returns the number of keys with a non-zero mask and the bytes held by word arrays.
func (r *residency) stats() (keys, bytes int) {
	for i := range r.shards {
		sh := &r.shards[i]
		keys += int(sh.live.Load())
		if t := sh.tab.Load(); t != nil {
			bytes += cap(t.w) * 8
		}
	}
	return keys, bytes
}

// makeFull returns a zeroed slice of at least n elements that spans its whole allocation: the allocator
// rounds a size up to its size class (or page), and the rounded tail is free.
func makeFull[E any](n int) []E {
	s := slices.Grow([]E(nil), n)
	s = s[:cap(s)]
	clear(s[n:])
	return s
}
