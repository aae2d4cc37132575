//go:build !race

package kvindex

import (
	"testing"
	"time"
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
		if !st.Trusted() {
			t.Fatalf("unexpected untrusted stream: %s", st.Reason())
		}
	})
	if n != 0 {
		t.Fatalf("%v allocs per Handle; want 0", n)
	}
}
