package routing

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/loadtest"
)

// TestDisaggTiny runs the disaggregated comparison on a tiny workload whose prompts are over the default
// prefill threshold: every request of the disaggregated fleets takes the prefill hop and its decode engine
// pulls blocks, the aggregated fleet hops nowhere, and the report renders the section and its goals.
func TestDisaggTiny(t *testing.T) {
	w := loadtest.Workload{Scenario: loadtest.SharedPrefix, Seed: 1, Groups: 2, PromptsPerGroup: 4, Popularity: loadtest.Uniform,
		SystemTokens: 320, QuestionTokens: 4, OutputTokens: 3}
	rep, err := Run(context.Background(), Options{
		Engines: 2, Scale: 16, MaxNumSeqs: 2, Concurrency: 2,
		PrefillPerToken: time.Microsecond, DecodePerToken: 100 * time.Microsecond,
		Strategies: []string{"round_robin"}, Scenarios: []string{loadtest.SharedPrefix},
		Workloads:  map[string]loadtest.Workload{loadtest.SharedPrefix: w},
		RunTimeout: 30 * time.Second, Repeats: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Disagg == nil || len(rep.Disagg.Trials) != len(DisaggFleets) {
		t.Fatalf("disaggregated trials: %+v", rep.Disagg)
	}
	for i, tr := range rep.Disagg.Trials {
		if !tr.ok() {
			t.Fatalf("%s: %s", tr.Fleet, tr.Error)
		}
		r := tr.Result
		n := uint64(r.Planned)
		if r.Succeeded != r.Planned || tr.ITL.N != r.Succeeded || tr.PrefillQueried == 0 {
			t.Fatalf("%s: %d of %d ok, ITL over %d, prefill queried %d", tr.Fleet, r.Succeeded, r.Planned, tr.ITL.N, tr.PrefillQueried)
		}
		hops := DisaggFleets[i].Prefill > 0
		if hops && (tr.RemotePrefills != n || tr.DecodeRequests != n || tr.BlocksPulled == 0) || !hops && (tr.RemotePrefills != 0 || tr.BlocksPulled != 0) {
			t.Fatalf("%s: %d prefills for decode, %d decode requests, %d blocks pulled, of %d requests",
				tr.Fleet, tr.RemotePrefills, tr.DecodeRequests, tr.BlocksPulled, n)
		}
	}
	md := rep.Markdown(nil)
	for _, want := range []string{"## Disaggregated prefill/decode", "| prefill-by-cache | cache_aware |", "| aggregated | cache_aware |"} {
		if !strings.Contains(md, want) {
			t.Fatalf("report lacks %q:\n%s", want, md)
		}
	}
	goals := 0
	for _, g := range rep.Goals {
		if strings.HasPrefix(g.Name, "disaggregated:") {
			goals++
		}
	}
	if goals != 2 {
		t.Fatalf("%d disaggregated goals, want 2", goals)
	}
}
