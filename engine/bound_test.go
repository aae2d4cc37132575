package engine

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestLoadBoundRule pins the bound on the rule itself: over random weights, loads and rankings, the first
// candidate after the bound always has room; a first choice with room stays first; one without gives way to
// the ranking's next candidate with room, else to the target with room of the longest match.
func TestLoadBoundRule(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 2000 {
		n := 2 + rng.IntN(7)
		weights := make([]float64, n)
		for i := range weights {
			weights[i] = float64(1 + rng.IntN(4))
		}
		r := testRoute(t, "consistent_hash", weights, "")
		var buf, out [maxTargets]int
		var p Pick
		allEligible(r, &p, buf[:])
		var matches [maxTargets]int32
		p.Matches, p.MatchOf = matches[:n], 100
		total, w := int64(1), 0.0
		for i, tg := range r.Targets {
			l := int64(rng.IntN(12))
			tg.Provider.inflight.Store(l)
			total += l
			w += weights[i]
			matches[i] = int32(rng.IntN(3) * 50)
		}
		room := func(i int) bool {
			l := float64(r.Targets[i].Load())
			return l+1 <= 1.25*weights[i]*(float64(total-1)-l)/(w-weights[i])+2
		}
		ranked := 1 + rng.IntN(n)
		perm := rng.Perm(n)
		copy(out[:], perm[:ranked])
		got, moved := r.bound.apply(&p, out[:], ranked)
		if !room(out[0]) {
			t.Fatalf("trial %d: first candidate %d has no room (loads, weights %v)", trial, out[0], weights)
		}
		if moved == room(perm[0]) {
			t.Fatalf("trial %d: moved %t, but the first choice's room is %t", trial, moved, room(perm[0]))
		}
		seen := map[int]bool{}
		for _, i := range out[:got] {
			if seen[i] {
				t.Fatalf("trial %d: target %d twice in %v", trial, i, out[:got])
			}
			seen[i] = true
		}
		if !moved {
			continue
		}
		next := -1
		for _, i := range perm[1:ranked] {
			if room(i) {
				next = i
				break
			}
		}
		switch {
		case next >= 0 && out[0] != next:
			t.Fatalf("trial %d: %d went first, the ranking's next with room is %d", trial, out[0], next)
		case next < 0:
			for i := range n {
				if room(i) && matches[i] > matches[out[0]] {
					t.Fatalf("trial %d: %d (match %d) went first, %d has room and match %d", trial, out[0], matches[out[0]], i, matches[i])
				}
			}
		}
	}
}

// TestLoadBoundPicked: a request ranked and not yet admitted counts in its target's load, so the burst's
// next ranking sees it; admission moves it to the in-flight count, and a request ended before admission
// gives it back.
func TestLoadBoundPicked(t *testing.T) {
	r := testRoute(t, "consistent_hash", []float64{1, 1}, "")
	pr := r.Targets[0].Provider
	c := &call{}
	c.pickTarget(pr)
	if pr.Load() != 1 || pr.Inflight() != 0 {
		t.Fatalf("picked: load %d, in flight %d", pr.Load(), pr.Inflight())
	}
	c.pickTarget(nil)
	if pr.Load() != 0 {
		t.Fatalf("after pickTarget(nil): load %d", pr.Load())
	}
}

// TestLoadBoundPickedSettles: whatever a request's end - served, retried off a dead target, refused for an
// unknown model, cut by its client - nothing stays counted as picked.
func TestLoadBoundPickedSettles(t *testing.T) {
	live := newFakeUpstream(t, okJSON)
	gw := startGateway(t, gatewayConfig("pipeline", "", "http://"+deadAddr(t), live.URL))
	for i := range 20 {
		post(t, gw.URL+"/v1/chat/completions", chatBody("m", fmt.Sprintf("question %d", i%3), false))
		post(t, gw.URL+"/v1/chat/completions", chatBody("nope", "question", false))
	}
	for _, tg := range gw.g.Snapshot().Routes[0].Targets {
		if n := tg.Provider.picked.Load(); n != 0 {
			t.Fatalf("%s: %d requests still counted as picked", tg.Provider.Name, n)
		}
	}
}

func BenchmarkLoadBound(b *testing.B) {
	for _, n := range []int{8, 64} {
		weights := make([]float64, n)
		for i := range weights {
			weights[i] = 1
		}
		r := testRoute(b, "consistent_hash", weights, "")
		var buf, out [maxTargets]int
		var p Pick
		allEligible(r, &p, buf[:])
		r.Targets[0].Provider.inflight.Store(int64(4 * n))
		b.Run(map[int]string{8: "targets=8", 64: "targets=64"}[n], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				out[0] = 0
				r.bound.apply(&p, out[:], 1)
			}
		})
	}
}
