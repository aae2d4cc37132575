// Package mix holds the integer mixer the routing tables share.
package mix

// Mix64 is SplitMix64's finalizer: every input bit flips about half the output bits, so small or structured
// keys (engine block hashes in tests, llm-d's FNV keys, consistent-hash points) spread over a table.
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
