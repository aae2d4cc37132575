package kvindex

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzpuzpuz/xsync/v3"
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

// BenchmarkIndexMemory measures heap bytes per (block, target) entry, everything included (shared table,
// slabs, engine-hash tables), for 16 targets of 60k blocks each: "distinct" gives every target its own
// blocks (worst case: nothing shared), "shared" gives all targets the same blocks (a common prefix).
func BenchmarkIndexMemory(b *testing.B) {
	const (
		targets   = 16
		perTarget = 60_000
	)
	for _, shared := range []bool{false, true} {
		name := "distinct"
		if shared {
			name = "shared"
		}
		b.Run(name, func(b *testing.B) {
			var perEntry float64
			for i := 0; i < b.N; i++ {
				before := heapInUse()
				ix := NewIndex(targets)
				for t := 0; t < targets; t++ {
					ti := ix.Target(t, 0)
					base := uint32(t * perTarget * 16)
					if shared {
						base = 0
					}
					tokens := make([]uint32, 16)
					var parent uint64
					for k := 0; k < perTarget; k++ {
						for j := range tokens {
							tokens[j] = base + uint32(k*16+j)
						}
						// Chains of 32 blocks, like prompts.
						if k%32 == 0 {
							parent = 0
						}
						h := uint64(t)<<32 | uint64(k+1)
						ti.BlockStored(storedEv([]uint64{h}, parent, tokens, 16))
						parent = h
					}
				}
				after := heapInUse()
				perEntry = float64(after-before) / float64(targets*perTarget)
				runtime.KeepAlive(ix)
			}
			b.ReportMetric(perEntry, "bytes/entry")
		})
	}
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
				r.set(mix64(k)|1, 1)
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
				m.Store(mix64(k)|1, 1)
			}
			perKey = float64(heapInUse()-before) / keys
			runtime.KeepAlive(m)
		}
		b.ReportMetric(perKey, "bytes/key")
	})
}
