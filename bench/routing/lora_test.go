package routing

import "testing"

// TestBeladyLoads: the textbook reference string takes 7 loads with 3 slots and 6 with 4 under optimal
// eviction; every adapter loads once when the slots hold them all, and each change of adapter loads with one slot.
func TestBeladyLoads(t *testing.T) {
	seq := []int{1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5}
	for slots, want := range map[int]int{3: 7, 4: 6, 5: 5, 1: 12} {
		if got := beladyLoads(seq, slots); got != want {
			t.Errorf("%d slots: %d loads, want %d", slots, got, want)
		}
	}
}
