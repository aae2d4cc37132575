package kvindex

import "testing"

// BenchmarkBlockKeys computes the keys of a 32k-token request (2048 blocks of 16).
func BenchmarkBlockKeys(b *testing.B) {
	tokens := seqRange(1, 32768)
	dst := make([]uint64, 0, 2048)
	b.ReportAllocs()
	b.SetBytes(int64(len(tokens) * 4))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst = BlockKeys(dst[:0], tokens, 16)
	}
	benchSink.Add(int64(dst[len(dst)-1]))
	b.ReportMetric(float64(b.N)*2048/b.Elapsed().Seconds(), "blocks/s")
}
