package tracing

import (
	"context"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Sink keeps benchmark results alive.
var Sink atomic.Uint64

func BenchmarkParseTraceparent(b *testing.B) {
	in := []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	var sum uint64
	for i := 0; i < b.N; i++ {
		tc, ok := ParseTraceparent(in)
		if ok {
			sum += uint64(tc.Flags)
		}
	}
	Sink.Add(sum)
}

func BenchmarkAppendTraceparent(b *testing.B) {
	tc := mustTC(specTraceID, specSpanID, 1)
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		buf = AppendTraceparent(buf[:0], tc)
	}
	Sink.Add(uint64(len(buf)))
}

// BenchmarkNewTraceContext draws span (and trace) ids from every P at once.
func BenchmarkNewTraceContext(b *testing.B) {
	for _, bc := range []struct {
		name      string
		hasParent bool
	}{{"child", true}, {"root", false}} {
		b.Run(bc.name, func(b *testing.B) {
			parent := mustTC(specTraceID, specSpanID, 1)
			s := NewSampler(0.1)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var sum uint64
				for pb.Next() {
					tc := NewTraceContext(parent, bc.hasParent, s)
					sum += uint64(tc.SpanID[0])
				}
				Sink.Add(sum)
			})
		})
	}
}

// BenchmarkRecord is the request path's cost of a span, from every P at once, with the real building
// goroutine and batch processor behind a collector that accepts everything at once. The builder cannot
// keep up with this loop, so most spans are dropped (dropped/op); full measures a queue nobody empties.
func BenchmarkRecord(b *testing.B) {
	run := func(b *testing.B, e *Exporter) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			child, _ := testSpans()
			for pb.Next() {
				e.Record(child)
			}
		})
		b.StopTimer()
		b.ReportMetric(float64(e.Dropped())/float64(b.N), "dropped/op")
	}
	b.Run("builder", func(b *testing.B) {
		e := newExporter(DefaultConfig(), nopExporter{}, nil, quietLog)
		defer e.Shutdown(context.Background())
		run(b, e)
	})
	b.Run("full", func(b *testing.B) {
		e := &Exporter{on: true, q: make(chan Span)}
		run(b, e)
	})
}

// BenchmarkBuild is the background cost of one span: building it through the SDK and batching it
// (the OTLP encoding and the network are not included).
func BenchmarkBuild(b *testing.B) {
	e := newExporter(DefaultConfig(), nopExporter{}, nil, quietLog)
	defer e.Shutdown(context.Background())
	child, _ := testSpans()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		e.build(child)
	}
}

// nopExporter accepts every batch.
type nopExporter struct{}

func (nopExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (nopExporter) Shutdown(context.Context) error                             { return nil }
