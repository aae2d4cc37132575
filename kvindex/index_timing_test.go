package kvindex

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzpuzpuz/xsync/v3"

	"github.com/rolter-ai/rolter/internal/mix"
)

var benchSink atomic.Int64

// newMatchBench returns an index where target t of n holds the first (t+1)/n of a request of nTokens
// tokens (block size 16), each target with its own engine hashes, and the request.
func newMatchBench(n, nTokens int) (*Index, []uint32) {
	ix := NewIndex(n)
	tokens := make([]uint32, nTokens)
	for i := range tokens {
		tokens[i] = uint32(i*7919 + 11)
	}
	nBlocks := nTokens / 16
	for t := 0; t < n; t++ {
		ti := ix.Target(t, 0)
		hold := nBlocks * (t + 1) / n
		var parent uint64
		for b := 0; b < hold; b++ {
			h := uint64(t)<<40 | uint64(b+1)
			ti.BlockStored(storedEv([]uint64{h}, parent, tokens[b*16:(b+1)*16], 16))
			parent = h
		}
	}
	return ix, tokens
}

// BenchmarkMatch32k16Targets looks up a 32k-token request (2048 blocks) on 16 targets, each holding a
// different long prefix of it; the walk reaches the end because one target holds it all.
func BenchmarkMatch32k16Targets(b *testing.B) {
	ix, tokens := newMatchBench(16, 32768)
	var s Scratch
	out := make([]int, 16)
	b.ReportAllocs()
	b.SetBytes(int64(len(tokens) * 4))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		benchSink.Add(int64(ix.Match(tokens, &s, out)))
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lookups/s")
	b.ReportMetric(float64(b.N)*2048/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkMatch2k16Targets is a typical chat prompt (2k tokens, 128 blocks) on the same layout.
func BenchmarkMatch2k16Targets(b *testing.B) {
	ix, tokens := newMatchBench(16, 2048)
	var s Scratch
	out := make([]int, 16)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		benchSink.Add(int64(ix.Match(tokens, &s, out)))
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lookups/s")
}

// ingestEvents returns a cycle of BlockStored events (chains of 4 single-block events of 16 tokens,
// like an engine caching a prompt block by block) and the BlockRemoved events that undo them.
func ingestEvents(chains int) (stored []*BlockStored, removed []*BlockRemoved) {
	tok := uint32(1)
	h := uint64(1)
	for c := 0; c < chains; c++ {
		var parent uint64
		for k := 0; k < 4; k++ {
			tokens := make([]uint32, 16)
			for j := range tokens {
				tokens[j] = tok
				tok++
			}
			stored = append(stored, storedEv([]uint64{h}, parent, tokens, 16))
			removed = append(removed, removedEv(h))
			parent = h
			h++
		}
	}
	return stored, removed
}

// BenchmarkIngest applies BlockStored events to a target holding ~64k blocks, with the engine's
// evictions as BlockRemoved events (every event counts).
func BenchmarkIngest(b *testing.B) {
	ix := NewIndex(1)
	ti := ix.Target(0, 0)
	stored, removed := ingestEvents(1 << 14)
	for _, ev := range stored {
		ti.BlockStored(ev)
	}
	b.ReportAllocs()
	b.ResetTimer()
	n := len(stored)
	for i := 0; i < b.N; i++ {
		j := i % n
		ti.BlockRemoved(removed[j])
		ti.BlockStored(stored[j])
	}
	b.ReportMetric(2*float64(b.N)/b.Elapsed().Seconds(), "events/s")
	if st := ti.Stats(); st.UnknownParents != 0 || st.UnknownRemoves != 0 {
		b.Fatalf("events did not take the full path: %+v", st)
	}
}

// BenchmarkMatchParallelWithIngest runs Match on every P while one writer per target (4 targets) ingests
// continuously, as the subscriber goroutines do.
func BenchmarkMatchParallelWithIngest(b *testing.B) {
	const targets = 4
	ix, tokens := newMatchBench(targets, 8192)
	var stop atomic.Bool
	var events atomic.Int64
	var wg sync.WaitGroup
	tis := make([]*TargetIndex, targets)
	for t := 0; t < targets; t++ {
		ti := ix.Target(t, 0)
		tis[t] = ti
		// Each writer removes a block and stores it again, like BenchmarkIngest, so every event does the
		// full work (no unknown parents).
		stored, removed := ingestEvents(4096)
		for i := range stored {
			stored[i].Hashes[0] |= uint64(t+1) << 56
			removed[i].Hashes[0] = stored[i].Hashes[0]
			if stored[i].HasParent {
				stored[i].Parent |= uint64(t+1) << 56
			}
			ti.BlockStored(stored[i])
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := int64(0)
			for i := 0; !stop.Load(); i++ {
				j := i % len(stored)
				ti.BlockRemoved(removed[j])
				ti.BlockStored(stored[j])
				n += 2
			}
			events.Add(n)
		}()
	}
	// Let the writers pass their first cycle (growth) before measuring.
	time.Sleep(200 * time.Millisecond)
	b.ReportAllocs()
	b.ResetTimer()
	start := events.Load()
	b.RunParallel(func(pb *testing.PB) {
		var s Scratch
		out := make([]int, targets)
		for pb.Next() {
			benchSink.Add(int64(ix.Match(tokens, &s, out)))
		}
	})
	elapsed := b.Elapsed().Seconds()
	stop.Store(true)
	wg.Wait()
	ingested := events.Load() - start
	for _, ti := range tis {
		if st := ti.Stats(); st.UnknownParents != 0 || st.UnknownRemoves != 0 {
			b.Fatalf("events did not take the full path: %+v", st)
		}
	}
	b.ReportMetric(float64(b.N)/elapsed, "lookups/s")
	b.ReportMetric(float64(ingested)/elapsed, "events/s")
	b.ReportMetric((float64(b.N)+float64(ingested))/elapsed, "events+lookups/s")
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// fillIndex returns an index of targets targets holding perTarget blocks of 16 tokens each (fillBlock), stored
// one event per block in chains of 32 blocks, like prompts.
func fillIndex(targets, perTarget int, shared bool) *Index {
	ix := NewIndex(targets)
	tokens := make([]uint32, 16)
	for t := 0; t < targets; t++ {
		ti := ix.Target(t, 0)
		var parent uint64
		for k := 0; k < perTarget; k++ {
			fillBlock(tokens, t, k, perTarget, shared)
			if k%32 == 0 {
				parent = 0
			}
			h := uint64(t)<<32 | uint64(k+1)
			ti.BlockStored(storedEv([]uint64{h}, parent, tokens, 16))
			parent = h
		}
	}
	return ix
}

// fillBlock writes the tokens of block k of target t of fillIndex to dst: the same blocks for every target
// when shared (a common prefix), else blocks of the target's own (nothing shared).
func fillBlock(dst []uint32, t, k, perTarget int, shared bool) {
	base := uint32(t * perTarget * 16)
	if shared {
		base = 0
	}
	for j := range dst {
		dst[j] = base + uint32(k*16+j)
	}
}

// indexBytesPerEntry returns the heap bytes of fillIndex(targets, perTarget, shared) per (block, target)
// entry, everything included (shared table, slabs, engine-hash tables).
func indexBytesPerEntry(targets, perTarget int, shared bool) float64 {
	before := heapInUse()
	ix := fillIndex(targets, perTarget, shared)
	after := heapInUse()
	runtime.KeepAlive(ix)
	return (float64(after) - float64(before)) / float64(targets*perTarget)
}

// churnIndex replaces, in each target of an index from fillIndex(_, perTarget, false), perTarget random
// resident blocks by new ones (a BlockRemoved, then a BlockStored starting a chain): the slab's dead
// records and spare chunks, the tables' tombstones and keys without holder, at their steady state.
func churnIndex(ix *Index, perTarget int) {
	rng := rand.New(rand.NewPCG(1, 2))
	tokens := make([]uint32, 16)
	resident := make([]uint64, perTarget)
	for t := 0; t < ix.MaxTargets(); t++ {
		ti := ix.Target(t, 0)
		for k := range resident {
			resident[k] = uint64(t)<<32 | uint64(k+1)
		}
		for k := perTarget; k < 2*perTarget; k++ {
			j := rng.IntN(perTarget)
			ti.BlockRemoved(removedEv(resident[j]))
			resident[j] = uint64(t)<<32 | uint64(k+1)
			fillBlock(tokens, t, k, perTarget, false)
			tokens[0] |= 1 << 31 // not a block of another target
			ti.BlockStored(storedEv([]uint64{resident[j]}, 0, tokens, 16))
		}
	}
}

// BenchmarkIndexMemory measures heap bytes per (block, target) entry for 16 targets holding distinct blocks
// (worst case: nothing shared), the same blocks (a common prefix), or distinct blocks after as many random
// removals and stores as blocks (churn), at several sizes: tables grow in steps, so one size alone could
// flatter them.
func BenchmarkIndexMemory(b *testing.B) {
	for _, kind := range []string{"distinct", "shared", "churn"} {
		for _, perTarget := range []int{30_000, 45_000, 60_000, 90_000} {
			b.Run(fmt.Sprintf("%s/%dk", kind, perTarget/1000), func(b *testing.B) {
				var perEntry float64
				for i := 0; i < b.N; i++ {
					before := heapInUse()
					ix := fillIndex(16, perTarget, kind == "shared")
					if kind == "churn" {
						churnIndex(ix, perTarget)
					}
					perEntry = (float64(heapInUse()) - float64(before)) / float64(16*perTarget)
					runtime.KeepAlive(ix)
				}
				b.ReportMetric(perEntry, "bytes/entry")
			})
		}
	}
}

// BenchmarkMatchLargeIndex looks up prompts in the index of BenchmarkIndexMemory/distinct/60k (a million
// keys, the tables at their working load and mostly out of cache): each prompt is one of the stored
// 32-block chains and a block nobody holds, so the walk does 32 hits and one miss.
func BenchmarkMatchLargeIndex(b *testing.B) {
	const targets, perTarget = 16, 60_000
	ix := fillIndex(targets, perTarget, false)
	rng := rand.New(rand.NewPCG(1, 2))
	prompts := make([][]uint32, 4096)
	for i := range prompts {
		t, chain := rng.IntN(targets), rng.IntN(perTarget/32)
		p := make([]uint32, 33*16)
		for k := 0; k < 32; k++ {
			fillBlock(p[k*16:(k+1)*16], t, chain*32+k, perTarget, false)
		}
		for j := 32 * 16; j < len(p); j++ {
			p[j] = math.MaxUint32
		}
		prompts[i] = p
	}
	var s Scratch
	out := make([]int, targets)
	if ix.Match(prompts[0], &s, out); slices.Max(out) != 32 {
		b.Fatalf("unexpected match %v", out)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		benchSink.Add(int64(ix.Match(prompts[i%len(prompts)], &s, out)))
	}
	b.ReportMetric(float64(b.N)*33/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkResidencyMemory compares the shared table with xsync.MapOf[uint64, uint64] (what a generic
// concurrent map would cost) in heap bytes per key; it is the benchmark behind the custom table.
func BenchmarkResidencyMemory(b *testing.B) {
	const keys = 1 << 20
	b.Run("residency", func(b *testing.B) {
		var perKey float64
		for i := 0; i < b.N; i++ {
			before := heapInUse()
			r := &residency{}
			for k := uint64(1); k <= keys; k++ {
				r.set(mix.Mix64(k)|1, 1)
			}
			perKey = float64(heapInUse()-before) / keys
			runtime.KeepAlive(r)
		}
		b.ReportMetric(perKey, "bytes/key")
	})
	b.Run("xsync.MapOf", func(b *testing.B) {
		var perKey float64
		for i := 0; i < b.N; i++ {
			before := heapInUse()
			m := xsync.NewMapOf[uint64, uint64]()
			for k := uint64(1); k <= keys; k++ {
				m.Store(mix.Mix64(k)|1, 1)
			}
			perKey = float64(heapInUse()-before) / keys
			runtime.KeepAlive(m)
		}
		b.ReportMetric(perKey, "bytes/key")
	})
}
