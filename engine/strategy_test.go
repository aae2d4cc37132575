package engine

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/config"
)

// testRoute builds a route with n targets (each on its own provider) and the given strategy.
func testRoute(t testing.TB, strategy string, weights []float64, params string) *Route {
	t.Helper()
	var b strings.Builder
	for i := range weights {
		fmt.Fprintf(&b, "[[providers]]\nname = \"p%d\"\napi_base = \"http://127.0.0.1:%d\"\n", i, 10000+i)
	}
	fmt.Fprintf(&b, "[[routes]]\nmodel = \"m\"\nstrategy = %q\n", strategy)
	if params != "" {
		fmt.Fprintf(&b, "[routes.params]\n%s\n", params)
	}
	for i, w := range weights {
		fmt.Fprintf(&b, "[[routes.targets]]\nprovider = \"p%d\"\nweight = %v\n", i, w)
	}
	cfg, err := config.Parse([]byte(b.String()), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	return testSnapshot(t, cfg).Routes[0]
}

func allEligible(r *Route, p *Pick, buf []int) {
	p.Route = r
	p.Eligible = buf[:0]
	p.EligibleMask = 0
	for i := range r.Targets {
		p.Eligible = append(p.Eligible, i)
		p.EligibleMask |= 1 << i
	}
}

// share picks n times and returns how often each target came first.
func share(r *Route, p *Pick, n int) []int {
	counts := make([]int, len(r.Targets))
	var out [maxTargets]int
	for i := 0; i < n; i++ {
		k, _ := r.Strategy.Rank(p, out[:])
		if k < 1 {
			panic("strategy wrote no candidate")
		}
		counts[out[0]]++
	}
	return counts
}

func assertShares(t *testing.T, counts []int, want []float64, tol float64) {
	t.Helper()
	total := 0
	for _, c := range counts {
		total += c
	}
	for i, c := range counts {
		got := float64(c) / float64(total)
		if math.Abs(got-want[i]) > tol {
			t.Fatalf("target %d got share %.3f, want %.3f±%.3f (counts %v)", i, got, want[i], tol, counts)
		}
	}
}

func TestStrategyDistributions(t *testing.T) {
	var buf [maxTargets]int
	f := func(strategy string, weights []float64, want []float64, tol float64) {
		t.Helper()
		r := testRoute(t, strategy, weights, "")
		var p Pick
		allEligible(r, &p, buf[:])
		assertShares(t, share(r, &p, 30000), want, tol)
	}
	third := []float64{1. / 3, 1. / 3, 1. / 3}
	f("round_robin", []float64{1, 1, 1}, third, 0.001)
	f("random", []float64{1, 1, 1}, third, 0.02)
	f("least_load", []float64{1, 1, 1}, third, 0.02) // equal loads: ties broken at random, not to target 0
	f("power_of_two", []float64{1, 1, 1}, third, 0.02)
	f("weighted", []float64{2, 1, 1}, []float64{0.5, 0.25, 0.25}, 0.001)
	f("weighted", []float64{0.3, 0.7}, []float64{0.3, 0.7}, 0.001)
}

func TestWeightedIsSmooth(t *testing.T) {
	r := testRoute(t, "weighted", []float64{5, 1, 1}, "")
	var buf, out [maxTargets]int
	var p Pick
	allEligible(r, &p, buf[:])
	var seq []int
	for i := 0; i < 7; i++ {
		r.Strategy.Rank(&p, out[:])
		seq = append(seq, out[0])
	}
	// nginx's smooth weighted round robin for 5,1,1.
	if fmt.Sprint(seq) != "[0 0 1 0 2 0 0]" {
		t.Fatalf("sequence %v", seq)
	}
}

func TestStrategiesSkipIneligible(t *testing.T) {
	for _, s := range []string{"round_robin", "random", "weighted", "least_load", "power_of_two"} {
		r := testRoute(t, s, []float64{3, 1, 1, 1}, "")
		var out [maxTargets]int
		p := Pick{Route: r, Eligible: []int{1, 3}, EligibleMask: 1<<1 | 1<<3}
		// The ineligible target 0 is idle while the others are busy: it must still never be chosen.
		r.Targets[1].Provider.inflight.Store(5)
		r.Targets[3].Provider.inflight.Store(7)
		seen := map[int]int{}
		for i := 0; i < 2000; i++ {
			n, _ := r.Strategy.Rank(&p, out[:])
			for _, ti := range out[:n] {
				if ti != 1 && ti != 3 {
					t.Fatalf("%s ranked ineligible target %d", s, ti)
				}
			}
			seen[out[0]]++
		}
		if s == "least_load" && seen[3] != 0 {
			t.Fatalf("least_load chose the busier target: %v", seen)
		}
		if s == "power_of_two" && seen[1] != 2000 {
			t.Fatalf("power_of_two with two candidates must always take the less loaded: %v", seen)
		}
		if (s == "round_robin" || s == "random" || s == "weighted") && (seen[1] == 0 || seen[3] == 0) {
			t.Fatalf("%s did not spread over the eligible targets: %v", s, seen)
		}
	}
}

func TestLeastLoadFollowsLoad(t *testing.T) {
	r := testRoute(t, "least_load", []float64{1, 1, 1}, "")
	var buf [maxTargets]int
	var p Pick
	allEligible(r, &p, buf[:])
	r.Targets[0].Provider.inflight.Store(3)
	r.Targets[1].Provider.inflight.Store(1)
	r.Targets[2].Provider.inflight.Store(2)
	assertShares(t, share(r, &p, 1000), []float64{0, 1, 0}, 0)
	// Scraped engine queue depth counts as load too.
	r.Targets[1].Provider.engineLoad = func() int64 { return 5 }
	assertShares(t, share(r, &p, 1000), []float64{0, 0, 1}, 0)
}
