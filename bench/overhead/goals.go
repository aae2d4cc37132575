package overhead

import (
	"fmt"

	"github.com/rolter-ai/rolter/bench/fleet"
)

// goalsOf evaluates the gateway overhead goals: per case, added c=1 latency p50 and c=64
// throughput against HAProxy's (and the p99 in the small-body case); in the streaming case, the added time to
// the first byte against HAProxy's and the stream gap; RSS flat per case.
func goalsOf(rep *Report) []fleet.Goal {
	var goals []fleet.Goal
	for _, c := range rep.Cases {
		ro, hp := c.Summary[PathRolter], c.Summary[PathHAProxy]
		if ro == nil {
			continue
		}
		ratioGoal := func(name, target string, limit float64, rv, hv float64, unit string, lowerIsBetter bool) {
			name = c.Label() + ": " + name
			if hp == nil {
				goals = append(goals, fleet.Goal{Name: name, Target: target, Measured: fmt.Sprintf("Rolter %.0f %s; HAProxy not measured", rv, unit), Verdict: "n/a"})
				return
			}
			if hv <= 0 {
				goals = append(goals, fleet.Goal{Name: name, Target: target,
					Measured: fmt.Sprintf("Rolter %.0f %s, HAProxy %.0f %s: HAProxy's is not above the noise, no ratio", rv, unit, hv, unit),
					Verdict:  fleet.Verdict(rv <= 0)})
				return
			}
			ratio := rv / hv
			ok := ratio <= limit
			if !lowerIsBetter {
				ok = ratio >= limit
			}
			goals = append(goals, fleet.Goal{Name: name, Target: target,
				Measured: fmt.Sprintf("%.2fx (Rolter %.0f %s, HAProxy %.0f %s)", ratio, rv, unit, hv, unit), Verdict: fleet.Verdict(ok)})
		}
		var hAddedP50, hAddedP99, hTput float64
		if hp != nil {
			hAddedP50, hAddedP99, hTput = hp.AddedP50, hp.AddedP99, hp.Throughput
		}
		ratioGoal("added latency at concurrency 1, p50 (Rolter ÷ HAProxy)", "<= 1.2x", 1.2, ro.AddedP50, hAddedP50, "µs", true)
		if c.Name == CaseSmall {
			ratioGoal("added latency at concurrency 1, p99 (Rolter ÷ HAProxy)", "<= 1.2x", 1.2, ro.AddedP99, hAddedP99, "µs", true)
		}
		ratioGoal(fmt.Sprintf("throughput at concurrency %d (Rolter ÷ HAProxy)", rep.Options.ThroughputConcurrency), ">= 0.8x", 0.8,
			ro.Throughput, hTput, "req/s", false)
		if c.Streams {
			var hAddedTTFB float64
			if hp != nil {
				hAddedTTFB = hp.AddedTTFB
			}
			ratioGoal("added stream time to first byte (Rolter ÷ HAProxy)", "<= 1.2x", 1.2, ro.AddedTTFB, hAddedTTFB, "µs", true)
		}
	}
	for _, c := range rep.Cases {
		ro, d := c.Summary[PathRolter], c.Summary[PathDirect]
		if !c.Streams || ro == nil || d == nil {
			continue
		}
		// The verdict uses the send-stamped measure: the raw gap percentiles also carry the
		// upstream's own timer jitter, which differs between streams and, on a shared machine,
		// swamps a 50 µs goal either way (both are shown).
		goals = append(goals, fleet.Goal{Name: c.Label() + ": added inter-chunk gap p99 (Rolter − direct, send-stamped)", Target: "< 50 µs",
			Measured: fmt.Sprintf("%+.1f µs (gap change p99 %.0f µs vs %.0f µs direct; raw gap p99 %+.0f µs: %.0f vs %.0f)",
				ro.AddedJitP99, ro.JitterP99, d.JitterP99, ro.AddedGapP99, ro.GapP99, d.GapP99),
			Verdict: fleet.Verdict(ro.AddedJitP99 < 50)})
	}
	for _, c := range rep.Cases {
		for _, rr := range c.RSS {
			if rr.Path != PathRolter {
				continue
			}
			goals = append(goals, fleet.Goal{Name: c.Label() + ": Rolter RSS flat across the sustained run", Target: "growth <= max(2 MiB, 5%)",
				Measured: fmt.Sprintf("%+.1f MiB (middle third %.1f, last third %.1f, peak %.1f, after %.1f MiB)",
					rr.GrowthMiB, rr.MiddleMiB, rr.LastMiB, rr.PeakMiB, rr.AfterMiB),
				Verdict: fleet.Verdict(rr.Flat)})
		}
	}
	return goals
}
