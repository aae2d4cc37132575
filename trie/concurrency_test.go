package trie

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Readers race writers that insert and evict under a tiny ceiling. A pinned
// prompt is re-inserted often enough that it is stored at every instant, so
// every Match of it must see its whole path even while splits, merges and
// removals rewrite the nodes around it; every other Match must return the
// length of a prefix some inserted prompt has. Run it with -race.
func TestConcurrentMatchAndInsert(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	word := words(rng)
	pinned := word(300)
	var universe [][]byte
	for range 200 {
		// Share a prefix of the pinned prompt so its path keeps changing.
		u := append(slices.Clip(pinned[:rng.IntN(len(pinned))]), word(1+rng.IntN(200))...)
		universe = append(universe, u)
	}
	bestPrefix := func(key []byte) int {
		best := commonPrefix(pinned, key)
		for _, u := range universe {
			best = max(best, commonPrefix(u, key))
		}
		return best
	}

	// With 4 nodes the pinned prompt and the one inserted after it always
	// fit (at most 3 nodes), so eviction never has to take the pinned one.
	tr := New(4)
	tr.Insert(pinned)
	empty := New(4)
	const writers, readers = 3, 4
	iterations := 3000
	if testing.Short() {
		iterations = 500
	}
	var wg sync.WaitGroup
	var mu sync.Mutex // keeps "pinned, then one other" atomic among writers
	var done atomic.Bool
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 9))
			for range iterations {
				mu.Lock()
				tr.Insert(universe[r.IntN(len(universe))])
				tr.Insert(pinned)
				mu.Unlock()
			}
		}()
	}
	errs := make(chan string, readers)
	var readerWG sync.WaitGroup
	for rd := range readers {
		readerWG.Add(1)
		go func() {
			defer readerWG.Done()
			r := rand.New(rand.NewPCG(uint64(rd), 10))
			for n := 0; !done.Load() || n < 100; n++ {
				if got := tr.Match(pinned); got != len(pinned) {
					errs <- "pinned prompt matched partially"
					return
				}
				// MatchEach walks tr twice side by side, beside an empty trie.
				var ms [3]int
				if MatchEach([]*Trie{tr, empty, tr}, pinned, ms[:]); ms != [3]int{len(pinned), 0, len(pinned)} {
					errs <- "pinned prompt matched partially by MatchEach"
					return
				}
				key := universe[r.IntN(len(universe))]
				key = append(slices.Clip(key[:r.IntN(len(key)+1)]), 'a'+byte(r.IntN(3)))
				got := tr.Match(key)
				if got > len(key) || got > bestPrefix(key) {
					errs <- "Match returned a prefix no prompt has"
					return
				}
				if MatchEach([]*Trie{tr, tr}, key, ms[:2]); max(ms[0], ms[1]) > bestPrefix(key) {
					errs <- "MatchEach returned a prefix no prompt has"
					return
				}
				_ = tr.Nodes()
				_ = tr.Stats()
			}
		}()
	}
	wg.Wait()
	done.Store(true)
	readerWG.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	mustInvariants(t, tr)
	if st := tr.Stats(); st.Evictions == 0 || st.Nodes > 4 {
		t.Fatalf("stats %+v: the test did not exercise eviction", st)
	}
	// Readers delayed reuse, but limbo stayed bounded (slack: one Insert).
	if s := tr.st.Load(); s.nodes.next > 4+limboMinNodes+64 || len(s.bytes.buf) > 4*limboMinBytes {
		t.Fatalf("memory grew with readers around: %d node slots, %d arena bytes", s.nodes.next, len(s.bytes.buf))
	}
}

// Many goroutines insert, evict and reset at once; the structure stays whole.
func TestConcurrentWriters(t *testing.T) {
	tr := New(16)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 11))
			key := make([]byte, 0, 64)
			for i := range 2000 {
				key = key[:0]
				for range 1 + r.IntN(40) {
					key = append(key, 'a'+byte(r.IntN(2)))
				}
				tr.Insert(key)
				tr.Match(key)
				if w == 0 && i%500 == 499 {
					tr.Reset()
				}
			}
		}()
	}
	wg.Wait()
	mustInvariants(t, tr)
}

// Match completes while the writer mutex is held: readers never wait for it.
func TestReadersNotBlockedByWriter(t *testing.T) {
	tr := New(0)
	tr.Insert([]byte("system prompt, user turn"))
	tr.mu.Lock() // a writer in the middle of Insert
	got := make(chan int)
	go func() {
		n := 0
		for range 1000 {
			n = tr.Match([]byte("system prompt, other turn"))
		}
		got <- n
	}()
	select {
	case n := <-got:
		if n != len("system prompt, ") {
			t.Errorf("Match = %d", n)
		}
	case <-time.After(30 * time.Second): // only a deadlock gets here
		t.Fatal("Match blocked while the writer mutex was held")
	}
	tr.mu.Unlock()
}

// A reader inside Match pins everything it could reach: while it stays, no
// node slot or arena byte it could see is reused, however much the writer
// churns, until limbo outgrows its bound; then the writer waits for the
// reader instead of growing memory. Once the reader leaves, reuse resumes.
func TestGracePeriod(t *testing.T) {
	tr := New(8)
	rng := rand.New(rand.NewPCG(12, 13))
	insert := func(n int) {
		for range n {
			key := make([]byte, 2+rng.IntN(20))
			for i := range key {
				key[i] = 'a' + byte(rng.IntN(3))
			}
			tr.Insert(key)
		}
	}
	insert(100)

	// Snapshot what a reader could reach now: every live node's edge and
	// child block, byte for byte.
	type seen struct {
		off   uint64
		n     uint32
		kids  uint64
		edge  []byte
		block []byte
	}
	s := tr.st.Load()
	snapshot := map[uint32]seen{}
	stack := []uint32{rootNode}
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		nd := s.nodes.at(i)
		o := nd.kids.Load()
		sn := seen{off: nd.off, n: nd.n, kids: o, edge: slices.Clone(s.edge(i))}
		if o != 0 {
			sn.block = slices.Clone(s.bytes.buf[o : o+blockSize(s.kidCount(o))])
			for j := range s.kidCount(o) {
				stack = append(stack, s.kidAt(o, j))
			}
		}
		snapshot[i] = sn
	}
	unchanged := func() {
		t.Helper()
		buf := s.bytes.view.Load().b
		for i, sn := range snapshot {
			nd := s.nodes.at(i)
			if nd.off != sn.off || nd.n != sn.n {
				t.Fatalf("node %d was reused while a reader could see it", i)
			}
			if !bytes.Equal(buf[sn.off:sn.off+uint64(sn.n)], sn.edge) {
				t.Fatalf("edge bytes of node %d were overwritten while a reader could see them", i)
			}
			if sn.kids != 0 && !bytes.Equal(buf[sn.kids:sn.kids+uint64(len(sn.block))], sn.block) {
				t.Fatalf("child block of node %d was overwritten while a reader could see it", i)
			}
		}
	}

	c := tr.readers.enter() // a reader stalls inside Match
	insert(150)             // retires fewer than limboMinNodes
	unchanged()
	if st := tr.Stats(); st.Evictions < 100 {
		t.Fatalf("only %d evictions", st.Evictions)
	}

	// Keep churning: limbo fills up and the writer starts waiting. Let the
	// reader go at the writer's first wait (without that, this deadlocks).
	waits := 0
	limboWait = func() {
		if waits++; waits > 1 {
			return
		}
		unchanged()
		limbo := len(s.retiring.nodes) + len(s.waiting.nodes)
		if !s.limboFull() || limbo > limboMinNodes+s.nodeCount/4+16 {
			t.Errorf("writer waits with %d nodes in limbo", limbo)
		}
		tr.readers.exit(c)
	}
	defer func() { limboWait = runtime.Gosched }()
	insert(5000)
	if waits == 0 {
		t.Fatal("the writer never waited: a stalled reader lets limbo grow without bound")
	}
	mustInvariants(t, tr)
	held := s.nodes.next
	insert(2000)
	if s.nodes.next > held+8 {
		t.Fatalf("node slots kept growing after the reader left: %d -> %d", held, s.nodes.next)
	}
}
