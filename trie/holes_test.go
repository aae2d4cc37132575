package trie

import (
	"math/rand/v2"
	"testing"
)

// TestHoleIndexModel runs random puts, gets and deletes against a map, with long churn at a steady size (the
// arena's pattern), and checks every key stays reachable and the table stays within its load factor.
func TestHoleIndexModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var h holeIndex
	model := map[uint64]int32{}
	var keys []uint64
	for step := 0; step < 200_000; step++ {
		target := 500
		if step < 20_000 {
			target = step / 10 // grow first, then churn at a steady size
		}
		if len(keys) < target || rng.IntN(2) == 0 && len(keys) < 2*target {
			// Offsets clustered like an arena's (nearby, both kinds), to exercise long runs.
			k := uint64(rng.IntN(4096)+1)<<1 | uint64(rng.IntN(2))
			if _, ok := model[k]; ok {
				continue
			}
			r := int32(rng.IntN(1 << 20))
			h.put(k, r)
			model[k] = r
			keys = append(keys, k)
		} else if len(keys) > 0 {
			i := rng.IntN(len(keys))
			k := keys[i]
			keys[i] = keys[len(keys)-1]
			keys = keys[:len(keys)-1]
			h.del(k)
			delete(model, k)
			if _, ok := h.get(k); ok {
				t.Fatalf("step %d: key %d found after delete", step, k)
			}
		}
		if step%997 == 0 {
			for k, r := range model {
				if got, ok := h.get(k); !ok || got != r {
					t.Fatalf("step %d: key %d: got %d %v, want %d", step, k, got, ok, r)
				}
			}
			if h.n != len(model) || 4*h.n > 3*len(h.slots) {
				t.Fatalf("step %d: %d keys (model %d) in %d slots", step, h.n, len(model), len(h.slots))
			}
		}
	}
	h.del(12345 << 1) // absent: no-op
	if _, ok := h.get(12345 << 1); ok {
		t.Fatal("absent key found")
	}
}

// BenchmarkHoleIndexChurn: the release pattern, a delete and a put of nearby keys at a steady size.
func BenchmarkHoleIndexChurn(b *testing.B) {
	var h holeIndex
	const live = 1 << 16
	for i := uint64(1); i <= live; i++ {
		h.put(startKey(i*64), int32(i))
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		k := uint64(i%live) + 1
		h.del(startKey(k * 64))
		h.put(startKey(k*64), int32(k))
		if _, ok := h.get(startKey(k * 64)); !ok {
			b.Fatal("lost key")
		}
	}
}
