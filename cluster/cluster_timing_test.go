package cluster

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/internal/mix"
)

// Sink keeps benchmark results alive.
var Sink atomic.Uint64

// BenchmarkHeld is the request path's cost on a full default-size table (2^20 slots): one request scoring 8
// engines with a 32-checkpoint key (an 8 KiB prompt), as cache_aware does; the peers sent it to one engine
// (whole), to another up to half, and never to the other six. From every P at once.
func BenchmarkHeld(b *testing.B) {
	cfg := testConfig()
	cfg.MaxEntries = 1 << 20
	c := newTestCluster(cfg)
	now := c.table.now()
	for i := 0; i < 1<<20; i++ { // fill it with other evidence first
		c.table.insert(entryKey(mix.Mix64(uint64(i)), engineKey(uint64(i%8))), now)
	}
	const keys = 1024
	cps := make([][]uint64, keys)
	for k := range cps {
		cps[k] = chain(uint64(k)+1<<32, 32)
		insertKey(c.table, uint64(k%8), cps[k], now)
		insertKey(c.table, uint64((k+1)%8), cps[k][:16], now)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var sum uint64
		k := 0
		for pb.Next() {
			key := cps[k%keys]
			for e := uint64(0); e < 8; e++ {
				sum += uint64(c.Held(e, key))
			}
			k++
		}
		Sink.Add(sum)
	})
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/8, "ns/held")
}

// BenchmarkRouted is the request path's cost of sharing one routing decision (a 96-checkpoint key, the
// largest).
//   - queued: one sender and a queue emptied (timer stopped) whenever it fills: every record is queued.
//   - parallel: every P at once with a goroutine draining the queue; dropped/op says how much the drain
//     (which, unlike the publisher, does nothing else) could not keep up with.
//   - full: every P at once on a queue nobody empties: the cost of a dropped record.
func BenchmarkRouted(b *testing.B) {
	cps := chain(1, maxCheckpoints)
	b.Run("queued", func(b *testing.B) {
		cfg := testConfig()
		cfg.QueueSize = 4096
		c := newTestCluster(cfg)
		b.ReportAllocs()
		for b.Loop() {
			c.Routed(7, cps)
			if len(c.queue) == cap(c.queue) {
				b.StopTimer()
				for len(c.queue) > 0 {
					<-c.queue
				}
				b.StartTimer()
			}
		}
		if n := c.dropped[dropQueueFull].Load(); n != 0 {
			b.Fatalf("%d dropped", n)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		cfg := testConfig()
		cfg.QueueSize = 4096
		c := newTestCluster(cfg)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-c.queue:
				case <-stop:
					return
				}
			}
		}()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				c.Routed(7, cps)
			}
		})
		b.StopTimer()
		close(stop)
		<-done
		b.ReportMetric(float64(c.dropped[dropQueueFull].Load())/float64(b.N), "dropped/op")
	})
	b.Run("full", func(b *testing.B) {
		cfg := testConfig()
		cfg.QueueSize = 1
		c := newTestCluster(cfg)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				c.Routed(7, cps)
			}
		})
	})
}

// BenchmarkApplyEvidence is the receiving side: one 32 KiB message of 32-checkpoint records (123 records,
// 3936 checkpoints) checked and inserted into a 2^20-slot table.
func BenchmarkApplyEvidence(b *testing.B) {
	cfg := testConfig()
	cfg.MaxEntries = 1 << 20
	cfg.PeerEvidencePerSec = 1 << 20 // the insert's cost, not the senders' rate limit
	c := newTestCluster(cfg)
	msgs := make([][]byte, 64)
	cpsPerMsg := 0
	for m := range msgs {
		msg := appendHeader(nil, uint64(m+2)) // 64 senders
		cpsPerMsg = 0
		for i := 0; len(msg)+recordBytes(32) <= batchBytes; i++ {
			msg = appendRecord(msg, uint64(i%8), chain(uint64(m<<16+i), 32))
			cpsPerMsg += 32
		}
		msgs[m] = msg
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(msgs[0])))
	for i := 0; b.Loop(); i++ {
		if err := c.applyEvidence(msgs[i%len(msgs)]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(cpsPerMsg), "ns/checkpoint")
}

// BenchmarkOpenEnvelope is what a key adds on the receiving side: verifying the MAC and timestamp of one
// 32 KiB evidence message.
func BenchmarkOpenEnvelope(b *testing.B) {
	sender := newKeyedCluster(testConfig(), 2, testKey)
	msg := sender.appendBatchHeader(nil)
	for i := 0; len(msg)+recordBytes(32) <= authHeader+batchBytes; i++ {
		msg = appendRecord(msg, uint64(i%8), chain(uint64(i), 32))
	}
	sender.signers[signPublisher].seal(kindEvidence, msg, time.Now().UnixNano())
	s := newSigner(testKey, sender.subjects)
	b.ReportAllocs()
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		if _, _, err := s.open(kindEvidence, msg, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFlushEvidence is the publisher's cost per record: dequeue, dedup, encode (96 checkpoints).
func BenchmarkFlushEvidence(b *testing.B) {
	cfg := testConfig()
	cfg.QueueSize = 1024
	c := newTestCluster(cfg)
	c.setSend(func(string, []byte) error { return nil })
	keys := make([][]uint64, 4096)
	for i := range keys {
		keys[i] = chain(uint64(i), maxCheckpoints)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		c.Routed(uint64(i%8), keys[i%len(keys)])
		if len(c.queue) == cap(c.queue) {
			c.flushEvidence()
			clear(c.recent[:])
		}
	}
}
