package scaleout

import (
	"fmt"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/loadtest"
)

func hitRateOf(r *Trial) float64   { return r.Result.HitRate }
func engineCoVOf(r *Trial) float64 { return r.EngineCoV }

// goalsOf evaluates the scale-out targets: with the most gateways, cache_aware loses at
// most 3 points of token hit rate against 1 gateway, and its engine load CoV stays within 0.1 of one
// gateway's, on both workloads.
func goalsOf(rep *Report) []fleet.Goal {
	const strategy = GoalStrategy
	most := 0
	for _, n := range rep.Options.Gateways {
		most = max(most, n)
	}
	hasOne := false
	for _, n := range rep.Options.Gateways {
		hasOne = hasOne || n == 1
	}
	var goals []fleet.Goal
	for _, scenario := range []string{loadtest.SharedPrefix, loadtest.MultiTurn} {
		gHit := fmt.Sprintf("%s token hit rate, %d gateways vs 1 (%s)", strategy, most, scenario)
		gCoV := fmt.Sprintf("%s engine load CoV (requests per engine), %d gateways vs 1 (%s)", strategy, most, scenario)
		const tHit, tCoV = "loses <= 3 points", "<= 1 gateway's + 0.1"
		na := func(why string) {
			goals = append(goals, fleet.Goal{Name: gHit, Target: tHit, Measured: why, Verdict: "n/a"},
				fleet.Goal{Name: gCoV, Target: tCoV, Measured: why, Verdict: "n/a"})
		}
		if !hasOne || most < 2 {
			na("needs runs with 1 gateway and with more")
			continue
		}
		one, many := rep.Run(scenario, strategy, 1), rep.Run(scenario, strategy, most)
		if why := unavailableWhy(one, "1 gateway"); why != "" {
			na(why)
			continue
		}
		if why := unavailableWhy(many, fmt.Sprintf("%d gateways", most)); why != "" {
			na(why)
			continue
		}
		h1, lo1, hi1, n1 := rep.Median(scenario, strategy, 1, hitRateOf)
		hN, loN, hiN, nN := rep.Median(scenario, strategy, most, hitRateOf)
		lost := (h1 - hN) * 100
		goals = append(goals, fleet.Goal{Name: gHit, Target: tHit,
			Measured: fmt.Sprintf("%.3f [%.3f–%.3f over %d runs] vs %.3f [%.3f–%.3f over %d runs]: %.1f points lost", hN, loN, hiN, nN, h1, lo1, hi1, n1, lost),
			Verdict:  fleet.Verdict(lost <= 3+1e-9)})
		c1, clo1, chi1, _ := rep.Median(scenario, strategy, 1, engineCoVOf)
		cN, cloN, chiN, _ := rep.Median(scenario, strategy, most, engineCoVOf)
		i1, _, _, _ := rep.Median(scenario, strategy, 1, func(r *Trial) float64 { return r.InflightCoV })
		iN, _, _, _ := rep.Median(scenario, strategy, most, func(r *Trial) float64 { return r.InflightCoV })
		goals = append(goals, fleet.Goal{Name: gCoV, Target: tCoV,
			Measured: fmt.Sprintf("%.3f [%.3f–%.3f] vs %.3f [%.3f–%.3f]: %+.3f (mean in-flight CoV %.3f vs %.3f)", cN, cloN, chiN, c1, clo1, chi1, cN-c1, iN, i1),
			Verdict:  fleet.Verdict(cN-c1 <= 0.1+1e-9)})
	}
	return goals
}

// unavailableWhy says why a representative run measured nothing, or "" when it did.
func unavailableWhy(r *Trial, what string) string {
	switch {
	case r == nil:
		return what + ": not run"
	case r.Unavailable != "":
		return what + ": " + r.Unavailable
	case r.Error != "":
		return what + " failed: " + fleet.FirstLine(r.Error)
	}
	return ""
}
