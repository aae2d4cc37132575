package engine

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// warmCacheRoute returns a cache_aware route over n targets, each holding a different conversation that
// shares the first half of key with it, plus unrelated prompts, so every Match walks half the key.
func warmCacheRoute(b *testing.B, n, keyLen int) (*Route, *cacheAware, []byte) {
	r, s := cacheRoute(b, n, "")
	rnd := rand.New(rand.NewPCG(1, 2))
	key := make([]byte, keyLen)
	for i := range key {
		key[i] = byte('a' + rnd.IntN(26))
	}
	for i, tr := range s.tries {
		other := slices.Clone(key)
		other[keyLen/2+i] ^= 0x20 // diverge after half the key, at a different byte per target
		tr.Insert(other)
		for j := 0; j < 50; j++ {
			tr.Insert([]byte(fmt.Sprintf("unrelated prompt %d for target %d %s", j, i, key[:256])))
		}
	}
	return r, s, key
}

// BenchmarkCacheAwarePick measures one cache_aware decision (a trie match per target + the load rule).
// It also reports the decision latency p99 over the run.
func BenchmarkCacheAwarePick(b *testing.B) {
	for _, tc := range []struct{ targets, keyLen int }{{8, 8 << 10}, {16, 128 << 10}} {
		b.Run(fmt.Sprintf("%dKiB-%dtargets", tc.keyLen>>10, tc.targets), func(b *testing.B) {
			r, _, key := warmCacheRoute(b, tc.targets, tc.keyLen)
			var buf, out [maxTargets]int
			var p Pick
			allEligible(r, &p, buf[:])
			p.Key = key
			lat := make([]time.Duration, 0, 1<<16)
			b.ReportAllocs()
			b.SetBytes(int64(len(key) * tc.targets))
			for b.Loop() {
				start := time.Now()
				r.Strategy.Rank(&p, out[:])
				if len(lat) < cap(lat) {
					lat = append(lat, time.Since(start))
				}
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
			Sink.Add(int64(out[0]))
		})
	}
}

// BenchmarkCacheAwarePickParallel picks from all cores while another goroutine keeps inserting and
// evicting (a small node ceiling) into the same tries.
func BenchmarkCacheAwarePickParallel(b *testing.B) {
	r, s := cacheRoute(b, 8, "max_trie_nodes = 2000")
	key := []byte(systemPrompt + "\x1euser\x1fwhat is the capital of France?")
	for _, tr := range s.tries {
		tr.Insert(key[:len(key)/2])
	}
	stop := make(chan struct{})
	var inserts atomic.Int64
	go func() {
		var p Pick
		var buf [maxTargets]int
		allEligible(r, &p, buf[:])
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p.Key = []byte(fmt.Sprintf("%s conversation %d", systemPrompt, i))
			s.Routed(&p, i%8)
			inserts.Add(1)
		}
	}()
	b.ReportAllocs()
	cpu := cpuNow()
	b.RunParallel(func(pb *testing.PB) {
		var buf, out [maxTargets]int
		var p Pick
		allEligible(r, &p, buf[:])
		p.Key = key
		for pb.Next() {
			r.Strategy.Rank(&p, out[:])
		}
		Sink.Add(int64(out[0]))
	})
	close(stop)
	reportCPU(b, cpu) // includes the inserting goroutine's
	b.ReportMetric(float64(inserts.Load())/b.Elapsed().Seconds(), "inserts/s")
}

// BenchmarkCacheAwareRecord measures recording a new conversation turn (prefix present + 1 KiB new).
func BenchmarkCacheAwareRecord(b *testing.B) {
	r, s := cacheRoute(b, 1, "")
	var buf [maxTargets]int
	var p Pick
	allEligible(r, &p, buf[:])
	base := []byte(systemPrompt)
	s.tries[0].Insert(base)
	turn := make([]byte, 0, len(base)+2048)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		turn = append(turn[:0], base...)
		turn = fmt.Appendf(turn, "turn %d ", i)
		for len(turn) < len(base)+1024 {
			turn = append(turn, "lorem ipsum "...)
		}
		p.Key = turn
		s.Routed(&p, 0)
		i++
	}
}
