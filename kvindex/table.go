package kvindex

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// residency maps own block keys to a bitmask of the targets holding the block on the GPU.
//
// It is a sharded open-addressing table with linear probing, 16 bytes per slot (key, mask) and no per-entry
// allocation: a generic concurrent map (xsync MapOf) allocates one 16-byte entry per write and costs about
// twice the memory per key (BenchmarkResidencyMemory compares both). Readers take no locks: a slot's key is
// written once, after its mask, and never changes until the shard's slot array is rebuilt and swapped
// whole; a mask dropping to zero leaves the key in place (a zombie that the next rebuild drops). So a reader
// that finds its key reads that key's current mask, and probing always ends at an empty slot because the
// load stays below residencyMaxLoad. Writers lock one shard.
type residency struct {
	shards [residencyShards]residencyShard
}

const (
	residencyShardBits = 8
	residencyShards    = 1 << residencyShardBits
	residencyMinSlots  = 16
)

type residencyShard struct {
	mu   sync.Mutex
	tab  atomic.Pointer[slotArray]
	used int // slots with a key, zombies included; guarded by mu
	live atomic.Int64
	_    [32]byte // keeps two shards' locks off one cache line
}

type slotArray struct {
	s []slot
}

type slot struct {
	key  atomic.Uint64
	bits atomic.Uint64
}

// slotPos spreads key over n slots. The shard is chosen by the top bits, so they are shifted out first.
func slotPos(key uint64, n int) int {
	hi, _ := bits.Mul64(key<<residencyShardBits, uint64(n))
	return int(hi)
}

// get returns the mask of key (0 when absent). It is safe for concurrent use and never blocks.
func (r *residency) get(key uint64) uint64 {
	t := r.shards[key>>(64-residencyShardBits)].tab.Load()
	if t == nil {
		return 0
	}
	s := t.s
	i := slotPos(key, len(s))
	for {
		k := s[i].key.Load()
		if k == key {
			return s[i].bits.Load()
		}
		if k == 0 {
			return 0
		}
		i++
		if i == len(s) {
			i = 0
		}
	}
}

// set ORs bit into the mask of key and returns the previous mask. key must not be 0.
func (r *residency) set(key, bit uint64) uint64 {
	sh := &r.shards[key>>(64-residencyShardBits)]
	sh.mu.Lock()
	t := sh.tab.Load()
	if t == nil || 5*(sh.used+1) > 4*len(t.s) {
		t = sh.rebuild(t)
	}
	s := t.s
	i := slotPos(key, len(s))
	for {
		k := s[i].key.Load()
		if k == key {
			old := s[i].bits.Load()
			s[i].bits.Store(old | bit)
			if old == 0 {
				sh.live.Add(1)
			}
			sh.mu.Unlock()
			return old
		}
		if k == 0 {
			// The mask goes first: a reader that sees the key must see its mask.
			s[i].bits.Store(bit)
			s[i].key.Store(key)
			sh.used++
			sh.live.Add(1)
			sh.mu.Unlock()
			return 0
		}
		i++
		if i == len(s) {
			i = 0
		}
	}
}

// clear removes bit from the mask of key and returns the previous mask.
func (r *residency) clear(key, bit uint64) uint64 {
	sh := &r.shards[key>>(64-residencyShardBits)]
	sh.mu.Lock()
	t := sh.tab.Load()
	if t == nil {
		sh.mu.Unlock()
		return 0
	}
	s := t.s
	i := slotPos(key, len(s))
	for {
		k := s[i].key.Load()
		if k == key {
			old := s[i].bits.Load()
			if old&bit != 0 {
				s[i].bits.Store(old &^ bit)
				if old == bit {
					sh.live.Add(-1)
				}
			}
			sh.mu.Unlock()
			return old
		}
		if k == 0 {
			sh.mu.Unlock()
			return 0
		}
		i++
		if i == len(s) {
			i = 0
		}
	}
}

// rebuild copies the live slots of t into a new array sized for 60% load and publishes it.
// Readers still walking t see a consistent, slightly stale view. Called with sh.mu held.
func (sh *residencyShard) rebuild(t *slotArray) *slotArray {
	live := int(sh.live.Load())
	n := max(residencyMinSlots, (live+1)*5/3+1)
	nt := &slotArray{s: make([]slot, n)}
	if t != nil {
		for i := range t.s {
			b := t.s[i].bits.Load()
			if b == 0 {
				continue
			}
			k := t.s[i].key.Load()
			j := slotPos(k, n)
			for nt.s[j].key.Load() != 0 {
				j++
				if j == n {
					j = 0
				}
			}
			nt.s[j].bits.Store(b)
			nt.s[j].key.Store(k)
		}
	}
	sh.used = live
	sh.tab.Store(nt)
	return nt
}

// stats returns the number of keys with a non-zero mask and the bytes held by slot arrays.
func (r *residency) stats() (keys, bytes int) {
	for i := range r.shards {
		sh := &r.shards[i]
		keys += int(sh.live.Load())
		if t := sh.tab.Load(); t != nil {
			bytes += len(t.s) * 16
		}
	}
	return keys, bytes
}
