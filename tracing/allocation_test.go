//go:build !race

package tracing

import (
	"testing"
)

func TestTraceparentAllocs(t *testing.T) {
	in := []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	ts := []byte("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
	buf := make([]byte, 0, 64)
	sampler := NewSampler(0.5)
	n := testing.AllocsPerRun(1000, func() {
		parent, ok := ParseTraceparent(in)
		if !ok || !ValidTracestate(ts) {
			t.Fatalf("cannot parse %q", in)
		}
		tc := NewTraceContext(parent, true, sampler)
		buf = AppendTraceparent(buf[:0], tc)
		tc = NewTraceContext(TraceContext{}, false, sampler)
		buf = AppendTraceparent(buf[:0], tc)
	})
	if n != 0 {
		t.Fatalf("ParseTraceparent+ValidTracestate+NewTraceContext+AppendTraceparent allocate %v times; want 0", n)
	}
}

// TestRecordAllocs measures Record alone: AllocsPerRun counts the whole process, and the building
// goroutine allocates (the SDK's spans), so the queue here has no builder behind it.
func TestRecordAllocs(t *testing.T) {
	for _, queue := range []int{2000, 1} { // room for every span, and a full queue that drops
		e := &Exporter{on: true, q: make(chan Span, queue)}
		child, _ := testSpans()
		n := testing.AllocsPerRun(1000, func() {
			e.Record(child)
		})
		if n != 0 {
			t.Fatalf("queue %d: Record allocates %v times per span; want 0", queue, n)
		}
		if queue == 1 && e.Dropped() == 0 {
			t.Fatalf("the full queue dropped nothing")
		}
	}
}
