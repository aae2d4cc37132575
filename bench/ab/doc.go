// Package ab compares two builds of `rolter serve` (bench/cmd/ab, `make bench-ab`): each round starts each
// build afresh and measures it on the overhead report's closed loop (overhead.Measure), alternating the
// order, and the report gives per round and in the median B against A.
package ab
