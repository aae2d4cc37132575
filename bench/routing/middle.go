package routing

import "sort"

// middle returns the element of ts with the median key - the lower middle for an even count - or nil when
// ts is empty: a comparison's representative repeat. ts is reordered.
func middle[T any](ts []*T, key func(*T) float64) *T {
	if len(ts) == 0 {
		return nil
	}
	sort.SliceStable(ts, func(i, j int) bool { return key(ts[i]) < key(ts[j]) })
	return ts[(len(ts)-1)/2]
}

// medianOf returns the median of f over ts (the lower middle for an even count) and how many there are.
func medianOf[T any](ts []*T, f func(*T) float64) (float64, int) {
	if len(ts) == 0 {
		return 0, 0
	}
	vs := make([]float64, len(ts))
	for i, t := range ts {
		vs[i] = f(t)
	}
	sort.Float64s(vs)
	return vs[(len(vs)-1)/2], len(vs)
}
