//go:build !race

package kvindex

import (
	"bytes"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"
)

func TestDecodeAllocs(t *testing.T) {
	f := func(name string, payload []byte) {
		t.Helper()
		var d Decoder
		var h countingHandler
		n := testing.AllocsPerRun(100, func() {
			if _, err := d.Decode(payload, &h); err != nil {
				t.Fatalf("%s: unexpected error: %s", name, err)
			}
		})
		if n != 0 {
			t.Fatalf("%s: %v allocs per Decode; want 0", name, n)
		}
	}
	f("positional batch", realisticBatch(false))
	f("map batch", realisticBatch(true))
	f("TV5", mustHex(t, hexTV5))
	f("TV6 bin hash", wrap(t, hexTV6BinRemoved))
}

func TestBlockKeysAllocs(t *testing.T) {
	tokens := seqRange(1, 4096)
	dst := make([]uint64, 0, 256)
	n := testing.AllocsPerRun(100, func() {
		dst = BlockKeys(dst[:0], tokens, 16)
	})
	if n != 0 {
		t.Fatalf("%v allocs per BlockKeys; want 0", n)
	}
}

func TestMatchAllocs(t *testing.T) {
	ix, tokens := newMatchBench(16, 32768)
	var s Scratch
	out := make([]int, 16)
	n := testing.AllocsPerRun(20, func() {
		ix.Match(tokens, &s, out)
	})
	if n != 0 {
		t.Fatalf("%v allocs per Match; want 0", n)
	}
}

func TestIngestAllocs(t *testing.T) {
	// Steady state: the same blocks stored and removed again reuse the slab, the engine-hash table and
	// the shared table's slots.
	ix := NewIndex(1)
	ti := ix.Target(0, 0)
	tokens := seqRange(1, 64)
	stored := storedEv([]uint64{1, 2, 3, 4}, 0, tokens, 16)
	removed := removedEv(1, 2, 3, 4)
	ti.BlockStored(stored)
	ti.BlockRemoved(removed)
	n := testing.AllocsPerRun(100, func() {
		ti.BlockStored(stored)
		ti.BlockRemoved(removed)
	})
	if n != 0 {
		t.Fatalf("%v allocs per store+remove; want 0", n)
	}
}

func TestStreamAllocs(t *testing.T) {
	ix := NewIndex(1)
	st := NewStream(ix.Target(0, 0), StreamConfig{StaleAfter: time.Minute})
	payload := batchOf(storedEvent([]uint64{1, 2}, 0, seqRange(1, 32), 16), removedEvent(1, 2))
	now := time.Now()
	seq := uint64(0)
	st.Handle(nil, seq, payload, now)
	n := testing.AllocsPerRun(100, func() {
		seq++
		st.Handle(nil, seq, payload, now)
		st.Tick(now)
		if s, r := st.Trust(); s != TrustExact {
			t.Fatalf("unexpected trust %s/%s", s, r)
		}
	})
	if n != 0 {
		t.Fatalf("%v allocs per Handle; want 0", n)
	}
}

// allocatedBy returns the bytes fn allocates.
func allocatedBy(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestDecodeScratchBudget(t *testing.T) {
	// A 16 MiB payload (the default MaxMessageBytes) of the densest elements decodes into at most
	// maxBatchScratch and then fails. Unbounded it allocated 934 MB (empty BlockRemoved events) and 769 MB
	// (1-byte hashes) counting append's growth copies, and kept the last copy for the target's lifetime;
	// 1-byte token ids cost 64 MiB.
	const size = DefaultMaxMessageBytes
	batch := func(events int, body []byte) []byte {
		b := msgp.AppendArrayHeader(nil, 2)
		b = msgp.AppendFloat64(b, 1)
		b = msgp.AppendArrayHeader(b, uint32(events))
		return append(b, body...)
	}
	emptyRemoved := append([]byte{0x92, 0xac}, "BlockRemoved\x90"...)
	f := func(name string, payload []byte) {
		t.Helper()
		var d Decoder
		var h countingHandler
		var err error
		n := allocatedBy(func() { _, err = d.Decode(payload, &h) })
		if err == nil || !strings.Contains(err.Error(), "decoder scratch") {
			t.Fatalf("%s: unexpected error %v", name, err)
		}
		// The budget and the copies that doubled up to it (75 MB for the events, measured); a header whose
		// claim the budget cannot pay fails before allocating (the hashes and tokens: 1 KiB).
		if n > 3*maxBatchScratch {
			t.Fatalf("%s: decoding a %d-byte payload allocated %d bytes", name, len(payload), n)
		}
		if cap(d.hashes)*8+cap(d.tokens)*4+cap(d.evs)*eventBytes > retainScratch {
			t.Fatalf("%s: the decoder kept its scratch", name)
		}
	}
	n := size / len(emptyRemoved)
	f("empty BlockRemoved events", batch(n, bytes.Repeat(emptyRemoved, n)))
	hashes := append([]byte{0x92, 0xac}, "BlockRemoved"...)
	hashes = msgp.AppendArrayHeader(hashes, size)
	f("1-byte hashes", batch(1, append(hashes, bytes.Repeat([]byte{1}, size)...)))
	tokens := append([]byte{0x95, 0xab}, "BlockStored\x90\xc0"...)
	tokens = msgp.AppendArrayHeader(tokens, size)
	f("1-byte token ids", batch(1, append(append(tokens, bytes.Repeat([]byte{1}, size)...), 0x10)))
}

func TestDecodeHugeDeclaredLengths(t *testing.T) {
	// Headers announcing 2^32-1 elements or bytes with a few bytes behind them fail without allocating in
	// proportion to the claim, wherever they stand.
	const huge = "ffffffff"
	f := func(name, hexPayload string) {
		t.Helper()
		payload := mustHex(t, hexPayload)
		// The least of a few runs, each with a new decoder: TotalAlloc is the whole process's, and a
		// goroutine an earlier test left behind may allocate during one run.
		n := uint64(math.MaxUint64)
		for range 5 {
			var d Decoder
			var h countingHandler
			var err error
			n = min(n, allocatedBy(func() { _, err = d.Decode(payload, &h) }))
			if err == nil {
				t.Fatalf("%s: expected an error", name)
			}
		}
		if n > 4<<10 {
			t.Fatalf("%s: a %d-byte payload allocated %d bytes", name, len(payload), n)
		}
	}
	removed := "92ac426c6f636b52656d6f766564" // ["BlockRemoved", <hashes>]
	f("batch array", "dd"+huge+"00")
	f("batch map", "df"+huge+"00")
	f("events", "93cb41d954fc40200000dd"+huge+"00")
	f("event array", hexBatchHead1+"dd"+huge+"00")
	f("event map", hexBatchHead1+"df"+huge+"00")
	f("hashes", hexBatchHead1+removed+"dd"+huge+"2a")
	f("tokens", hexBatchHead1+"95ab426c6f636b53746f72656490c0dd"+huge+"01")
	f("tag str32", hexBatchHead1+"91db"+huge+"41")
	f("bin32 hash", hexBatchHead1+removed+"91c6"+huge+"01")
	f("unknown field array", hexBatchHead1+"93ac426c6f636b52656d6f766564912add"+huge+"00")
	f("unknown field map", hexBatchHead1+"93ac426c6f636b52656d6f766564912adf"+huge+"00")
	f("unknown field ext32", hexBatchHead1+"93ac426c6f636b52656d6f766564912ac9"+huge+"0500")
	f("unknown batch element", "94cb41d954fc4020000090c0dd"+huge+"00")
	f("map key str32", hexBatchHead1+"81db"+huge+"41")
}

func TestIndexMemory(t *testing.T) {
	// Heap bytes per (block, target) entry after GC, as BenchmarkIndexMemory measures them (30.6 to 31.3
	// when targets hold distinct blocks, 21.7 to 22.9 when they share them), with a margin for the tables' growth steps and the allocator: LRU links back in the
	// records, or 16-byte slots for keys one target holds, fail it.
	f := func(perTarget int, shared bool, limit float64) {
		t.Helper()
		if got := indexBytesPerEntry(16, perTarget, shared); got > limit {
			t.Fatalf("%d blocks per target, shared %v: %.1f bytes per entry; want at most %.0f", perTarget, shared, got, limit)
		}
	}
	f(30_000, false, 36)
	f(60_000, false, 36)
	f(60_000, true, 27)
}
