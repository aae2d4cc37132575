package kvindex

import (
	"testing"
	"time"
)

func BenchmarkDecode(b *testing.B) {
	for _, mapEvents := range []bool{false, true} {
		name := "positional"
		if mapEvents {
			name = "map"
		}
		b.Run(name, func(b *testing.B) {
			payload := realisticBatch(mapEvents)
			var d Decoder
			var h countingHandler
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			for i := 0; i < b.N; i++ {
				if _, err := d.Decode(payload, &h); err != nil {
					b.Fatal(err)
				}
			}
			benchSink.Add(int64(h.stored))
			b.ReportMetric(16*float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkStreamHandle is the subscriber's work per message after ZMQ: sequence check, decode, apply
// (12 BlockStored of 2 blocks and 4 BlockRemoved per batch).
func BenchmarkStreamHandle(b *testing.B) {
	ix := NewIndex(1)
	st := NewStream(ix.Target(0, 1<<16), StreamConfig{})
	payload := realisticBatch(false)
	now := time.Now()
	b.ReportAllocs()
	b.SetBytes(int64(len(payload)))
	for i := 0; i < b.N; i++ {
		st.Handle(nil, uint64(i), payload, now)
	}
	benchSink.Add(int64(st.Stats().Blocks))
	b.ReportMetric(16*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
