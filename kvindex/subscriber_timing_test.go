//go:build cgo

package kvindex

import (
	"testing"
	"time"
)

// BenchmarkSubscriber is the whole path over loopback ZMQ: an in-process XPUB publishes realistic batches
// (16 events each) at most 4096 ahead of the last one applied; the subscriber's reader queues them and its
// applier applies them. The publisher shares the machine's cores, so this is a floor for the subscriber.
// It also keeps the reader honest: batches the publisher drops show up as a gap and fail it.
func BenchmarkSubscriber(b *testing.B) {
	zctx := newTestContext(b)
	pub := newTestPub(b, zctx, "")
	ix := NewIndex(1)
	s, err := NewSubscriber(ix, discardLogger)
	if err != nil {
		b.Fatalf("cannot create subscriber: %s", err)
	}
	defer s.Stop()
	st, err := s.Add(0, SubscriberConfig{Endpoint: pub.endpoint})
	if err != nil {
		b.Fatalf("cannot add: %s", err)
	}
	s.Start(b.Context())
	pub.waitSubscribed()
	// vLLM's PUB buffers 100,000 batches per subscriber (set after the connection: a bound socket's
	// connections take the options of the bind).
	_ = pub.sock.SetSndhwm(100_000)
	payload := realisticBatch(false)
	b.ReportAllocs()
	b.SetBytes(int64(len(payload)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for i%256 == 0 && i-int(st.Stats().LastSeq) > 4096 {
			time.Sleep(20 * time.Microsecond)
		}
		pub.send(nil, be64(uint64(i)), payload)
	}
	for deadline := time.Now().Add(time.Minute); st.Stats().LastSeq != uint64(b.N-1); {
		if time.Now().After(deadline) {
			b.Fatalf("batches missing: %+v", st.Stats())
		}
		time.Sleep(20 * time.Microsecond)
	}
	b.StopTimer()
	if stats := st.Stats(); stats.Gaps != 0 || stats.QueueDrops != 0 {
		b.Fatalf("lost batches: %+v", stats)
	}
	benchSink.Add(int64(st.Stats().Blocks))
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "batches/s")
}
