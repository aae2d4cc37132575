package accesslog

import (
	"io"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
)

// Sink keeps benchmark results alive.
var Sink atomic.Uint64

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
func (discard) Close() error                { return nil }

var _ io.WriteCloser = discard{}

// BenchmarkLog is the request path's cost: Want and Log from every P at once.
//   - writer: the real writer formatting into a discarding destination; it cannot keep up with this
//     loop, so most lines are dropped (dropped/op says how many).
//   - queued: one sender and a queue that never fills: the cost of a queued line.
//   - full: a queue nobody empties: the cost of a dropped line.
func BenchmarkLog(b *testing.B) {
	run := func(b *testing.B, l *Logger) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			r := exampleRecord()
			var n uint64
			for pb.Next() {
				if l.Want(time.Second, rand.Uint64()) {
					l.Log(r)
					n++
				}
			}
			Sink.Add(n)
		})
		b.StopTimer()
		b.ReportMetric(float64(l.Dropped())/float64(b.N), "dropped/op")
	}
	b.Run("writer", func(b *testing.B) {
		l := newLogger(enabledConfig("discard"), discard{}, "discard", quietLog)
		defer l.Close()
		run(b, l)
	})
	b.Run("queued", func(b *testing.B) {
		// The queue is emptied, timer stopped, whenever it fills: every send succeeds.
		l := &Logger{on: true, sampleAll: true, q: make(chan Record, DefaultQueueSize)}
		r := exampleRecord()
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if l.Want(time.Second, rand.Uint64()) {
				l.Log(r)
			}
			if len(l.q) == cap(l.q) {
				b.StopTimer()
				for len(l.q) > 0 {
					<-l.q
				}
				b.StartTimer()
			}
		}
		b.ReportMetric(float64(l.Dropped())/float64(b.N), "dropped/op")
	})
	b.Run("full", func(b *testing.B) {
		l := &Logger{on: true, sampleAll: true, q: make(chan Record)}
		run(b, l)
	})
}

func BenchmarkFormatJSON(b *testing.B) {
	r := exampleRecord()
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	b.SetBytes(int64(len(AppendJSON(nil, r))))
	for i := 0; i < b.N; i++ {
		buf = AppendJSON(buf[:0], r)
	}
	Sink.Add(uint64(len(buf)))
}

func BenchmarkFormatText(b *testing.B) {
	r := exampleRecord()
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	b.SetBytes(int64(len(AppendText(nil, r))))
	for i := 0; i < b.N; i++ {
		buf = AppendText(buf[:0], r)
	}
	Sink.Add(uint64(len(buf)))
}
