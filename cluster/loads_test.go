package cluster

import (
	"fmt"
	"maps"
	"testing"
	"time"
)

// loadsRecorder keeps what peerLoads hands the gateway.
type loadsRecorder struct {
	last  map[string]int64
	calls int
}

func (r *loadsRecorder) set(m map[string]int64) {
	r.last = maps.Clone(m)
	r.calls++
}

func TestPeerLoads(t *testing.T) {
	var rec loadsRecorder
	l := newPeerLoads(rec.set, time.Second, 64)
	l.setKnown(map[string]int64{"a": 100, "b": 100})
	t0 := time.Now()
	f := func(id string, inflight map[string]int64, at time.Duration, want map[string]int64) {
		t.Helper()
		l.update(loadMessage{ID: id, Inflight: inflight}, 0, t0.Add(at))
		if !maps.Equal(rec.last, want) {
			t.Fatalf("after %s %v: loads %v; want %v", id, inflight, rec.last, want)
		}
	}
	f("r1", map[string]int64{"a": 3}, 0, map[string]int64{"a": 3})
	f("r2", map[string]int64{"a": 2, "b": 1}, 0, map[string]int64{"a": 5, "b": 1})
	f("r1", map[string]int64{"a": 1, "b": 4}, 0, map[string]int64{"a": 3, "b": 5})
	f("r2", map[string]int64{}, 0, map[string]int64{"a": 1, "b": 4})
	f("r3", map[string]int64{"zzz": 100}, 0, map[string]int64{"a": 1, "b": 4}) // not a provider of ours
	calls := rec.calls
	f("r1", map[string]int64{"a": 1, "b": 4}, 0, map[string]int64{"a": 1, "b": 4})
	if rec.calls != calls {
		t.Fatal("an unchanged load message set the loads again")
	}
	if n := l.live.Load(); n != 3 {
		t.Fatalf("%d live peers; want 3", n)
	}
	// r1 goes quiet; r2 and r3 keep talking.
	f("r2", map[string]int64{"b": 2}, 900*time.Millisecond, map[string]int64{"a": 1, "b": 6})
	f("r3", map[string]int64{}, 900*time.Millisecond, map[string]int64{"a": 1, "b": 6})
	l.expire(t0.Add(1500 * time.Millisecond))
	if want := map[string]int64{"b": 2}; !maps.Equal(rec.last, want) {
		t.Fatalf("after r1 expired: %v; want %v", rec.last, want)
	}
	if n := l.live.Load(); n != 2 {
		t.Fatalf("%d live peers; want 2", n)
	}
	l.close()
	if rec.last != nil {
		t.Fatalf("close left loads %v", rec.last)
	}
	f("r2", map[string]int64{"b": 7}, 2*time.Second, nil) // after close: ignored
}

func TestPeerLoadsBounded(t *testing.T) {
	const maxPeers = 16
	var rec loadsRecorder
	l := newPeerLoads(rec.set, time.Second, maxPeers)
	l.setKnown(map[string]int64{"a": 100})
	t0 := time.Now()
	for i := 0; i < maxPeers; i++ {
		if r := l.update(loadMessage{ID: fmt.Sprint(i), Inflight: map[string]int64{"a": 1}}, 0, t0); r != (updateResult{}) {
			t.Fatalf("peer %d refused: %+v", i, r)
		}
	}
	if r := l.update(loadMessage{ID: "one too many", Inflight: map[string]int64{"a": 1}}, 0, t0); !r.tooMany || !r.firstTooMany {
		t.Fatalf("peer beyond maxPeers: %+v; want refused, and its refusal reported", r)
	}
	if r := l.update(loadMessage{ID: "two too many", Inflight: map[string]int64{"a": 1}}, 0, t0); !r.tooMany || r.firstTooMany {
		t.Fatalf("a second peer beyond maxPeers: %+v; want refused, and not reported again: it is logged once", r)
	}
	if rec.last["a"] != maxPeers || l.live.Load() != maxPeers {
		t.Fatalf("loads %v with %d peers; want %d", rec.last, l.live.Load(), maxPeers)
	}
	// Once the others go quiet there is room again.
	if r := l.update(loadMessage{ID: "late", Inflight: map[string]int64{"a": 5}}, 0, t0.Add(2*time.Second)); r.tooMany {
		t.Fatal("a peer refused after the others expired")
	}
	if rec.last["a"] != 5 || l.live.Load() != 1 {
		t.Fatalf("loads %v with %d peers; want a=5 from one", rec.last, l.live.Load())
	}
}

func TestPeerLoadsCapped(t *testing.T) {
	// A peer's claim on a provider is cut to the provider's cap, however large it claims.
	var rec loadsRecorder
	l := newPeerLoads(rec.set, time.Second, 64)
	l.setKnown(map[string]int64{"a": 8, "b": 1024})
	t0 := time.Now()
	r := l.update(loadMessage{ID: "greedy", Inflight: map[string]int64{"a": maxInflight, "b": 3}}, 0, t0)
	if r.capped != 1 || !maps.Equal(rec.last, map[string]int64{"a": 8, "b": 3}) {
		t.Fatalf("capped %d, loads %v; want 1 claim capped, a=8 b=3", r.capped, rec.last)
	}
	// The same claim again changes nothing (the cut value is the one kept), and is counted again.
	calls := rec.calls
	if r := l.update(loadMessage{ID: "greedy", Inflight: map[string]int64{"a": maxInflight, "b": 3}}, 0, t0); r.capped != 1 || rec.calls != calls {
		t.Fatalf("capped %d, %d calls; want 1 and no new call", r.capped, rec.calls-calls)
	}
}

func TestPeerLoadsReplayed(t *testing.T) {
	// With envelopes, a message whose timestamp is not after the peer's last is ignored.
	var rec loadsRecorder
	l := newPeerLoads(rec.set, time.Second, 64)
	l.setKnown(map[string]int64{"a": 100})
	t0 := time.Now()
	l.update(loadMessage{ID: "p", Inflight: map[string]int64{"a": 2}}, 10, t0)
	l.update(loadMessage{ID: "p", Inflight: map[string]int64{"a": 0}}, 11, t0)
	if r := l.update(loadMessage{ID: "p", Inflight: map[string]int64{"a": 2}}, 10, t0); !r.replayed {
		t.Fatal("a replayed message taken")
	}
	if rec.last["a"] != 0 {
		t.Fatalf("loads %v after a replay; want a=0", rec.last)
	}
}
