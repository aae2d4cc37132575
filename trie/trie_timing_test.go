package trie

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

var sinkInt int

// corpus builds chat-shaped prompt keys: a few shared system prompts, then
// conversations whose turns each append about 1 KiB to the previous prompt.
type corpus struct {
	rng     *rand.Rand
	systems [][]byte
	convs   [][]byte // each conversation's full text; prompts are its prefixes
}

func newCorpus(seed uint64) *corpus {
	c := &corpus{rng: rand.New(rand.NewPCG(seed, 42))}
	for range 8 {
		c.systems = append(c.systems, c.text("system", 2<<10))
	}
	for range 64 {
		conv := slices.Clone(c.systems[c.rng.IntN(len(c.systems))])
		for len(conv) < 256<<10 {
			conv = append(conv, c.text("user", 300+c.rng.IntN(1500))...)
		}
		c.convs = append(c.convs, conv)
	}
	return c
}

// text returns role, a separator byte, n bytes of word-like text and a terminator.
func (c *corpus) text(role string, n int) []byte {
	b := append([]byte(role), 0)
	for len(b) < n {
		b = append(b, " the of and to a in is that it for on with as was "[c.rng.IntN(12)*4:][:4]...)
		b = append(b, byte('a'+c.rng.IntN(26)), byte('a'+c.rng.IntN(26)))
	}
	return append(b, 1)
}

// conversation returns the first n bytes of conversation i.
func (c *corpus) conversation(i, n int) []byte {
	return c.convs[i%len(c.convs)][:n]
}

// request returns a key of n bytes whose first n-256 bytes are a stored turn.
func (c *corpus) request(n int) []byte {
	key := slices.Clone(c.conversation(0, n-256))
	return append(key, c.text("user", 256)[:256]...)
}

// warmTrie stores, for every conversation, its turns up to 160 KiB at 1 KiB
// steps: prompt i+1 extends prompt i, as consecutive turns do.
func (c *corpus) warmTrie(maxNodes int) *Trie {
	tr := New(maxNodes)
	for i := range c.convs {
		for n := 1 << 10; n <= 160<<10; n += 1 << 10 {
			tr.Insert(c.conversation(i, n))
		}
	}
	return tr
}

func benchmarkMatch(b *testing.B, size int) {
	c := newCorpus(1)
	tr := c.warmTrie(0)
	key := c.request(size)
	if got := tr.Match(key); got != size-256 {
		b.Fatalf("Match = %d; want %d", got, size-256)
	}
	b.ReportAllocs()
	b.SetBytes(int64(size))
	b.ResetTimer()
	for b.Loop() {
		sinkInt += tr.Match(key)
	}
}

func BenchmarkMatch8KiB(b *testing.B)   { benchmarkMatch(b, 8<<10) }
func BenchmarkMatch128KiB(b *testing.B) { benchmarkMatch(b, 128<<10) }

// BenchmarkInsertTurn inserts a new turn: a stored 16 KiB prompt plus 1 KiB
// that is new, with the ceiling reached so that each Insert also evicts.
func BenchmarkInsertTurn(b *testing.B) {
	c := newCorpus(3)
	const tails = 4096
	base := c.conversation(0, 16<<10)
	tailText := make([][]byte, tails)
	for i := range tailText {
		tailText[i] = c.text("user", 1<<10)[:1<<10]
	}
	tr := New(1000)
	tr.Insert(base)
	key := slices.Clone(base)
	benchInsertEvicting(b, tr, tails, 1<<10, func(i int) {
		key = append(key[:len(base)], tailText[i%tails]...)
		tr.Insert(key)
	})
}

// benchInsertEvicting calls insert(0..warm-1) to fill tr, then times one insert per op (of size bytes each,
// continuing the sequence), and fails if tr never evicted: the benchmarks measure inserts into a full trie.
func benchInsertEvicting(b *testing.B, tr *Trie, warm int, size int64, insert func(i int)) {
	for i := range warm {
		insert(i)
	}
	b.ReportAllocs()
	b.SetBytes(size)
	b.ResetTimer()
	i := warm
	for b.Loop() {
		insert(i)
		i++
	}
	b.StopTimer()
	if st := tr.Stats(); st.Evictions == 0 {
		b.Fatalf("no evictions: %+v", st)
	}
}

// BenchmarkInsertUnique8KiB inserts 8 KiB prompts that differ from their 9th byte on, into a trie capped
// by edge bytes and full, so that each Insert also evicts the oldest prompt: the gateway's cache_aware path
// under prompts that never repeat (the overhead report's cache case).
func BenchmarkInsertUnique8KiB(b *testing.B) {
	c := newCorpus(5)
	const size, pool = 8 << 10, 1024
	texts := make([][]byte, pool)
	for i := range texts {
		texts[i] = c.text("user", size)[:size]
	}
	tr := NewLimited(0, 4096*size)
	key := make([]byte, size)
	benchInsertEvicting(b, tr, 8192, size, func(i int) {
		copy(key, texts[i%pool])
		key[8], key[9], key[10], key[11] = byte(i), byte(i>>8), byte(i>>16), byte(i>>24)
		tr.Insert(key)
	})
}

// BenchmarkInsertPresent re-inserts a stored 8 KiB prompt (only its recency changes).
func BenchmarkInsertPresent(b *testing.B) {
	c := newCorpus(4)
	tr := c.warmTrie(0)
	key := c.conversation(0, 8<<10)
	b.ReportAllocs()
	b.SetBytes(int64(len(key)))
	for b.Loop() {
		tr.Insert(key)
	}
}

// BenchmarkMatchParallelWithWriter matches 8 KiB keys from every P while one
// goroutine inserts and evicts continuously under a small ceiling.
func BenchmarkMatchParallelWithWriter(b *testing.B) {
	c := newCorpus(5)
	tr := New(256)
	for i := range c.convs {
		tr.Insert(c.conversation(i, 8<<10))
	}
	var stop atomic.Bool
	var inserts atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewPCG(6, 6))
		for !stop.Load() {
			tr.Insert(c.conversation(r.IntN(len(c.convs)), 1<<10+r.IntN(15<<10)))
			inserts.Add(1)
		}
	}()
	b.ReportAllocs()
	b.SetBytes(8 << 10)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		key := c.request(8 << 10)
		n := 0
		for pb.Next() {
			n += tr.Match(key)
		}
		sinkInt += n
	})
	b.StopTimer()
	stop.Store(true)
	wg.Wait()
	b.ReportMetric(float64(inserts.Load())/b.Elapsed().Seconds(), "inserts/s")
}

// BenchmarkMemory reports what a full trie costs. Nothing is timed; the
// metrics are the result:
//
//	node-B/node    node slab, child blocks, prompt records and allocator
//	               metadata, per node (target <= 64)
//	arena-B/edge-B byte arena capacity net of child blocks, per stored edge
//	               byte (growth slack and holes included; target ~1)
//	heap-B/node    Go heap growth minus one byte per stored edge byte, per
//	               node: everything beyond the edge bytes, measured
func BenchmarkMemory(b *testing.B) {
	f := func(name string, fill func(tr *Trie)) {
		b.Run(name, func(b *testing.B) {
			var tr *Trie
			var heap uint64
			for b.Loop() {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				tr = New(0)
				fill(tr)
				runtime.GC()
				runtime.ReadMemStats(&after)
				heap = after.HeapAlloc - before.HeapAlloc
			}
			st := tr.Stats()
			s := tr.st.Load()
			arena := cap(s.bytes.buf)
			nodes := float64(st.Nodes)
			b.ReportMetric(nodes, "nodes")
			b.ReportMetric(float64(st.EdgeBytes)/nodes, "edge-B/node")
			b.ReportMetric(float64(st.ArenaBytes-arena+s.kidsBytes)/nodes, "node-B/node")
			b.ReportMetric(float64(arena-s.kidsBytes)/float64(st.EdgeBytes), "arena-B/edge-B")
			b.ReportMetric((float64(heap)-float64(st.EdgeBytes))/nodes, "heap-B/node")
		})
	}
	c := newCorpus(7)
	f("chat", func(tr *Trie) {
		// 64 conversations x 160 turns: long edges, one node per turn.
		for i := range c.convs {
			for n := 1 << 10; n <= 160<<10; n += 1 << 10 {
				tr.Insert(c.conversation(i, n))
			}
		}
	})
	f("short", func(tr *Trie) {
		// 100k random 8..40-byte keys over 4 letters: tiny edges, the
		// worst case for bytes per node.
		r := rand.New(rand.NewPCG(8, 8))
		key := make([]byte, 0, 40)
		for range 100_000 {
			key = key[:0]
			for range 8 + r.IntN(33) {
				key = append(key, 'a'+byte(r.IntN(4)))
			}
			tr.Insert(key)
		}
	})
}

// BenchmarkMatchFour matches a key against four tries, one trie after another (Match) and side by side
// (MatchEach, as the cache strategies match their targets). "cold": tries too large for the processor's
// caches (100,000 prompts each, 40 MiB of edges) and random keys whose walks all go deep, so most levels
// are cache misses. "cached": the same 8 KiB request against four copies of BenchmarkMatch8KiB's trie.
func BenchmarkMatchFour(b *testing.B) {
	text := strings.Repeat("question prompt answers prefix a and of and request routing latency the user engine ", 20)
	prompt := func(i, t int) []byte {
		off := (i*7919 + t*13) % 1000
		return fmt.Appendf(nil, "request %04d%08d: %s", i%64, i/64, text[off:off+400])
	}
	const prompts = 100_000
	var cold [4]*Trie
	for k := range cold {
		cold[k] = New(1 << 21)
		for i := range prompts {
			cold[k].Insert(prompt(i, k))
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	coldKeys := make([][]byte, 1<<16)
	for i := range coldKeys {
		coldKeys[i] = prompt(rng.IntN(prompts), len(cold))
	}
	c := newCorpus(1)
	cached := [4]*Trie{c.warmTrie(0), c.warmTrie(0), c.warmTrie(0), c.warmTrie(0)}
	cachedKeys := [][]byte{c.request(8 << 10)}
	for _, set := range []struct {
		name string
		ts   [4]*Trie
		keys [][]byte
	}{{"cold", cold, coldKeys}, {"cached", cached, cachedKeys}} {
		b.Run(set.name+"/Match", func(b *testing.B) {
			i := 0
			for b.Loop() {
				for _, tr := range set.ts {
					sinkInt += tr.Match(set.keys[i%len(set.keys)])
				}
				i++
			}
		})
		b.Run(set.name+"/MatchEach", func(b *testing.B) {
			var ms [4]int
			i := 0
			for b.Loop() {
				MatchEach(set.ts[:], set.keys[i%len(set.keys)], ms[:])
				sinkInt += ms[0]
				i++
			}
		})
	}
}
