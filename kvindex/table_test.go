package kvindex

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// TestResidencyModel checks set/clear/get against a map over enough keys that shards rebuild, both to grow
// and to drop zombies, with keys going from one holder to several and back (bits 7 and 63 included: they
// live elsewhere than the others in a word, see residency).
func TestResidencyModel(t *testing.T) {
	var r residency
	rng := rand.New(rand.NewPCG(3, 4))
	model := map[uint64]uint64{}
	keys := make([]uint64, 20000)
	for i := range keys {
		keys[i] = rng.Uint64() | 1
	}
	// Keys equal in their low 56 bits (the key word) but in different shards must stay apart.
	keys[1] = keys[0] ^ 1<<60
	holders := []int{0, 1, 6, 7, 8, 62, 63}
	for step := 0; step < 200000; step++ {
		k := keys[rng.IntN(len(keys))]
		bit := uint64(1) << uint(holders[rng.IntN(len(holders))])
		if rng.IntN(2) == 0 {
			if old := r.set(k, bit); old != model[k] {
				t.Fatalf("step %d: set returned %b; model %b", step, old, model[k])
			}
			model[k] |= bit
		} else {
			if old := r.clear(k, bit); old != model[k] {
				t.Fatalf("step %d: clear returned %b; model %b", step, old, model[k])
			}
			if model[k] &^= bit; model[k] == 0 {
				delete(model, k)
			}
		}
		if step%20000 == 0 {
			for _, k := range keys {
				if got := r.get(k); got != model[k] {
					t.Fatalf("step %d: get(%x) = %b; model %b", step, k, got, model[k])
				}
			}
			if n, _ := r.stats(); n != len(model) {
				t.Fatalf("step %d: %d live keys; model %d", step, n, len(model))
			}
		}
	}
}

// TestResidencyConcurrent reads keys that stay set while writers churn other keys of the same shards
// (forcing rebuilds) and add and remove holders of the stable keys themselves (turning them, and the keys
// that share their cells, from one holder to several: a key moves when its cell's other word becomes a
// mask): a reader must never miss a stable key's bit. Run with -race as well.
func TestResidencyConcurrent(t *testing.T) {
	var r residency
	rng := rand.New(rand.NewPCG(5, 6))
	stable := make([]uint64, 2000)
	for i := range stable {
		stable[i] = rng.Uint64() | 1
		r.set(stable[i], 1)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 9))
			churn := make([]uint64, 5000)
			for i := range churn {
				churn[i] = rng.Uint64() | 1
			}
			for i := 0; i < 60000; i++ {
				k := churn[rng.IntN(len(churn))]
				if i%5 == 4 {
					k = stable[rng.IntN(len(stable))]
				}
				bit := uint64(2) << (i / 2 % 3 * 3) // 1<<1, 1<<4, 1<<7
				if i%2 == 0 {
					r.set(k, bit)
				} else {
					r.clear(k, bit)
				}
			}
			stop.Store(true)
		}(uint64(w))
	}
	var misses atomic.Int64
	for rd := 0; rd < 2; rd++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				for _, k := range stable {
					if r.get(k)&1 == 0 {
						misses.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	if n := misses.Load(); n != 0 {
		t.Fatalf("readers missed stable keys %d times", n)
	}
}
