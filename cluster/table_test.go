package cluster

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/internal/mix"
)

// insertKey publishes cps for engine into t at now, as applyEvidence does.
func insertKey(t *table, engine uint64, cps []uint64, now uint32) {
	ek := engineKey(engine)
	for _, cp := range cps {
		t.insert(entryKey(cp, ek), now)
	}
}

// chain returns n checkpoints of a key named seed: keys with the same seed share their checkpoints.
func chain(seed uint64, n int) []uint64 {
	cps := make([]uint64, n)
	for i := range cps {
		cps[i] = mix.Mix64(seed*1000003 + uint64(i))
	}
	return cps
}

func TestTableSize(t *testing.T) {
	f := func(maxEntries, want int) {
		t.Helper()
		if got := newTable(maxEntries, time.Minute).size(); got != want {
			t.Fatalf("newTable(%d): %d slots; want %d", maxEntries, got, want)
		}
	}
	f(0, 8)
	f(1, 8)
	f(8, 8)
	f(9, 16)
	f(1000, 1024)
	f(1024, 1024)
	f(1025, 2048)
	f(1<<20, 1<<20)
}

func TestTableHeld(t *testing.T) {
	tab := newTable(1<<12, time.Minute)
	now := tab.now()
	long := chain(1, 40)
	insertKey(tab, 7, long[:25], now)
	f := func(engine uint64, cps []uint64, want int) {
		t.Helper()
		if got := tab.held(engine, cps); got != want {
			t.Fatalf("held(%d, %d cps) = %d; want %d", engine, len(cps), got, want)
		}
	}
	f(7, long, 25)       // a longer key sharing the published prefix
	f(7, long[:25], 25)  // the same key
	f(7, long[:10], 10)  // a shorter one
	f(7, long[:1], 1)    // the first checkpoint alone
	f(8, long, 0)        // another engine
	f(7, chain(2, 5), 0) // another key
	f(7, nil, 0)
	// Every length between.
	for n := 1; n <= len(long); n++ {
		f(7, long[:n], min(n, 25))
	}
}

func TestTableHeldPrefixes(t *testing.T) {
	// Several keys of one engine branching from one prefix: each is held as far as it was published.
	tab := newTable(1<<14, time.Minute)
	now := tab.now()
	base := chain(3, 96)
	branch := append(append([]uint64(nil), base[:30]...), chain(4, 66)...)
	insertKey(tab, 1, base[:60], now)
	insertKey(tab, 1, branch[:50], now)
	f := func(cps []uint64, want int) {
		t.Helper()
		if got := tab.held(1, cps); got != want {
			t.Fatalf("held = %d; want %d", got, want)
		}
	}
	f(base, 60)
	f(branch, 50)
	f(append(append([]uint64(nil), base[:30]...), chain(5, 10)...), 30)
}

func TestTableTTL(t *testing.T) {
	tab := newTable(1<<10, 10<<tickShift) // 10 ticks
	cps := chain(9, 4)
	start := tab.now()
	insertKey(tab, 1, cps, start)
	f := func(now uint32, want bool) {
		t.Helper()
		got := tab.has(entryKey(cps[0], engineKey(1)), now)
		if got != want {
			t.Fatalf("at tick %d (inserted at %d, ttl 10): held %v; want %v", now, start, got, want)
		}
	}
	f(start, true)
	f(start+9, true)
	f(start+10, false)
	f(start+1000, false)
	f(start-1, true) // a reader that read the clock before the writer
	// A refresh restarts the TTL.
	insertKey(tab, 1, cps, start+8)
	f(start+17, true)
	f(start+18, false)
}

func TestTableHeldExpires(t *testing.T) {
	// Through the clock: a TTL of one tick (67 ms) passes.
	tab := newTable(1<<10, time.Nanosecond)
	cps := chain(11, 3)
	insertKey(tab, 2, cps, tab.now())
	if got := tab.held(2, cps); got != 3 {
		t.Fatalf("held right after insert = %d; want 3", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for tab.held(2, cps) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("evidence with a one-tick TTL still held after 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestTableEviction(t *testing.T) {
	// One bucket: the ninth key replaces the oldest, and a refreshed key is not the oldest.
	tab := newTable(bucketSlots, time.Hour)
	keys := make([]uint64, bucketSlots+2)
	for i := range keys {
		keys[i] = uint64(i + 1)
	}
	for i := 0; i < bucketSlots; i++ {
		tab.insert(keys[i], uint32(10+i))
	}
	tab.insert(keys[0], 100) // refresh: keys[1] is now the oldest
	tab.insert(keys[8], 101)
	f := func(key uint64, want bool) {
		t.Helper()
		if got := tab.has(key, 102); got != want {
			t.Fatalf("has(%d) = %v; want %v", key, got, want)
		}
	}
	f(keys[0], true)
	f(keys[1], false)
	f(keys[2], true)
	f(keys[8], true)
	tab.insert(keys[9], 103) // replaces keys[2]
	f(keys[2], false)
	f(keys[9], true)
	if n := tab.used.Load(); n != bucketSlots {
		t.Fatalf("used = %d; want %d", n, bucketSlots)
	}
	// An expired slot is the oldest: it goes before a fresh one.
	tab2 := newTable(bucketSlots, 50<<tickShift)
	for i := 0; i < bucketSlots; i++ {
		tab2.insert(keys[i], uint32(1000+i))
	}
	tab2.insert(keys[3], 5000) // fresh; all others expired at 5001
	tab2.insert(keys[8], 5001)
	if !tab2.has(keys[3], 5001) || !tab2.has(keys[8], 5001) {
		t.Fatal("a fresh key was evicted before expired ones")
	}
}

func TestTableBoundedMemory(t *testing.T) {
	// A flood of distinct prompts: the table keeps its size and the heap does not grow with the flood.
	tab := newTable(1<<12, time.Hour)
	slots := tab.size()
	flood := func(from, n int) {
		now := tab.now()
		for i := from; i < from+n; i++ {
			insertKey(tab, uint64(i%8), []uint64{mix.Mix64(uint64(i)), mix.Mix64(uint64(i) + 1<<40)}, now)
		}
	}
	flood(0, 1<<14)
	heap0 := heapInUse()
	flood(1<<14, 1<<20)
	heap1 := heapInUse()
	if tab.size() != slots || int(tab.used.Load()) > slots {
		t.Fatalf("after 2M inserts: %d slots (%d used); want %d", tab.size(), tab.used.Load(), slots)
	}
	if grown := int64(heap1) - int64(heap0); grown > 4<<20 {
		t.Fatalf("heap grew by %d bytes over 2M inserts; want a table of fixed size", grown)
	}
	// The latest evidence is still there.
	last := 1<<14 + 1<<20 - 1
	if got := tab.held(uint64(last%8), []uint64{mix.Mix64(uint64(last)), mix.Mix64(uint64(last) + 1<<40)}); got != 2 {
		t.Fatalf("held of the last key = %d; want 2", got)
	}
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

func TestTableConcurrent(t *testing.T) {
	// One writer, many readers (run with -race): a reader never sees a key nobody published.
	tab := newTable(1<<8, time.Hour)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stray := chain(1<<30, 8)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if tab.held(uint64(i%4), stray) != 0 {
					t.Error("held a key nobody published")
					return
				}
				_ = tab.held(uint64(i%4), chain(uint64(i%500), 8))
			}
		}()
	}
	now := tab.now()
	for i := 0; i < 20000; i++ {
		insertKey(tab, uint64(i%4), chain(uint64(i%500), 8), now)
	}
	close(stop)
	wg.Wait()
}
