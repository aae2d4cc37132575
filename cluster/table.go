package cluster

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/rolter-ai/rolter/internal/mix"
)

// table is the peers' evidence: which checkpoints (engine.Peers) other replicas sent to which engine, and
// when they last said so.
//
// It is a fixed array of 16-byte slots (key, stamp) in buckets of bucketSlots, sized once from max_entries
// and never grown, so a flood of distinct prompts costs no memory: it only evicts. A key is
// entryKey(checkpoint, engine), never 0 (0 marks an empty slot); its bucket is chosen by the key's top bits
// and the key is looked for in that bucket only, so a lookup reads one bucket (two cache lines). Insert
// refreshes the key's stamp if the bucket holds it, else fills an empty slot, else replaces the slot with the
// oldest stamp (expired ones first, as they are the oldest).
//
// One goroutine writes (the evidence subscription's handler: nats.go calls it serially); any number read,
// with atomic loads and no locks. Replacing a slot stores key 0, then the stamp, then the new key; a reader
// loads the key, the stamp and the key again and trusts the stamp only if the key did not change, so it never
// pairs a key with the stamp of the key that replaces it.
type table struct {
	slots []slot
	shift uint  // bucket = key >> shift
	ttl   int32 // in ticks
	epoch time.Time
	used  atomic.Int64 // slots ever filled: they are never emptied again
}

type slot struct {
	key   atomic.Uint64
	stamp atomic.Uint32 // ticks since epoch, wrapping (fresh compares int32 differences)
}

const (
	// bucketSlots is the probe window: the slots a key may occupy.
	bucketSlots = 8
	// tickShift makes a stamp's unit 2^26 ns (67 ms): coarse, and 32 bits last 9 years.
	tickShift = 26
	// maxTTLTicks keeps ages comparable as int32 differences.
	maxTTLTicks = 1 << 30
)

// newTable returns a table of maxEntries slots rounded up to a power of two (at least one bucket) whose
// entries count for ttl.
func newTable(maxEntries int, ttl time.Duration) *table {
	n := bucketSlots
	for n < maxEntries {
		n <<= 1
	}
	ticks := (int64(ttl) + 1<<tickShift - 1) >> tickShift
	ticks = min(max(ticks, 1), maxTTLTicks)
	return &table{
		slots: make([]slot, n),
		shift: uint(64 - bits.TrailingZeros(uint(n/bucketSlots))),
		ttl:   int32(ticks),
		epoch: time.Now(),
	}
}

// now is the current time in ticks.
func (t *table) now() uint32 { return uint32(time.Since(t.epoch) >> tickShift) }

// fresh reports whether a stamp is younger than the TTL at now. A stamp written after now was read (by the
// writer, while a reader held an older now) is fresh.
func (t *table) fresh(stamp, now uint32) bool { return int32(now-stamp) < t.ttl }

// bucket returns the slots key may occupy.
func (t *table) bucket(key uint64) []slot {
	// A shift of 64 (one bucket) gives 0 in Go.
	i := int(key>>t.shift) * bucketSlots
	return t.slots[i : i+bucketSlots : i+bucketSlots]
}

// engineKey is the part of an entry's key that names the engine, computed once per lookup.
func engineKey(engine uint64) uint64 { return mix.Mix64(engine ^ 0x9e3779b97f4a7c15) }

// entryKey names checkpoint cp of the engine whose engineKey is ek; never 0.
func entryKey(cp, ek uint64) uint64 {
	if k := mix.Mix64(cp ^ ek); k != 0 {
		return k
	}
	return 1
}

// has reports whether key is in the table and fresh at now. Safe for concurrent use with insert.
func (t *table) has(key uint64, now uint32) bool {
	b := t.bucket(key)
	for i := range b {
		if b[i].key.Load() != key {
			continue
		}
		s := b[i].stamp.Load()
		return b[i].key.Load() == key && t.fresh(s, now)
	}
	return false
}

// insert records key as seen at now. Only one goroutine may call it.
func (t *table) insert(key uint64, now uint32) {
	b := t.bucket(key)
	victim, oldest := 0, int32(math.MinInt32)
	for i := range b {
		switch k := b[i].key.Load(); k {
		case key:
			b[i].stamp.Store(now)
			return
		case 0:
			// Slots are never emptied (a replacement's 0 is the writer's own, and gone when it returns), so
			// a bucket fills from its first slot and the first empty one ends the keys it holds.
			b[i].stamp.Store(now)
			b[i].key.Store(key)
			t.used.Add(1)
			return
		}
		if age := int32(now - b[i].stamp.Load()); age > oldest {
			victim, oldest = i, age
		}
	}
	s := &b[victim]
	s.key.Store(0)
	s.stamp.Store(now)
	s.key.Store(key)
}

// held returns the largest k such that the checkpoint cps[k-1] of engine is in the table and fresh (0 when
// none is). Evidence is prefix-closed - a record for an engine carries every checkpoint of its key from the
// first - so a binary search finds k; after evictions or losses it finds a k whose checkpoint is held. It
// reads at most 2 + log2(len(cps)) buckets, does not allocate and is safe for concurrent use with insert.
func (t *table) held(engine uint64, cps []uint64) int {
	if len(cps) == 0 {
		return 0
	}
	ek := engineKey(engine)
	now := t.now()
	if !t.has(entryKey(cps[0], ek), now) {
		return 0 // the common case: a target other replicas did not send this prompt to
	}
	n := len(cps)
	if t.has(entryKey(cps[n-1], ek), now) {
		return n // the other common case: a repeated prompt
	}
	lo, hi := 1, n-1 // cps[lo-1] held, cps[hi] not: the answer is in [lo, hi]
	for lo < hi {
		mid := int(uint(lo+hi+1) >> 1)
		if t.has(entryKey(cps[mid-1], ek), now) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// size returns the number of slots.
func (t *table) size() int { return len(t.slots) }
