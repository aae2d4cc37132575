package pressure

import (
	"fmt"
	"sort"
	"strings"

	"github.com/rolter-ai/rolter/loadtest"
)

// noisyCPU is the other processes' CPU use above which a cell's latencies are flagged.
const noisyCPU = 0.3

// summary is "What the numbers say": sentences computed from the cells, nothing written by hand.
func (rep *Report) summary() string {
	var b strings.Builder
	for _, w := range rep.Workloads {
		rep.workloadSummary(&b, w)
	}
	rep.noiseSummary(&b)
	return b.String()
}

// workloadSummary writes the sentences of one workload, nothing when no cell of it measured anything.
func (rep *Report) workloadSummary(b *strings.Builder, w *WorkloadInfo) {
	lines := rep.bestLines(w)
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(b, "- **%s**: %s.\n", w.Workload.Name, strings.Join(lines, "; "))
	rep.capacitySummary(b, w)
	rep.roundRobinSummary(b, w)
	rep.balanceSummary(b, w)
	rep.ttftSummary(b, w)
	rep.recommendedSummary(b, w)
}

// bestLines says, per capacity, which strategy hit most and how the others compare with the placement
// reference.
func (rep *Report) bestLines(w *WorkloadInfo) []string {
	var lines []string
	for _, lv := range w.Levels {
		cells := rep.availableAt(w.Workload.Name, lv.Capacity)
		if len(cells) == 0 {
			continue
		}
		sort.SliceStable(cells, func(i, j int) bool { return cells[i].HitRate > cells[j].HitRate })
		best := cells[0]
		line := fmt.Sprintf("at %s (%d blocks per engine) the highest hit rate is %s's %.3f = %.2f of the placement reference (%.3f)",
			pct(lv.Capacity), lv.NumBlocks, best.Strategy, best.HitRate, best.VsPlacement(), best.PlacementHitRate)
		if best.VsRoundRobin > 0 && best.Strategy != "round_robin" {
			line += fmt.Sprintf(", %.1f× round_robin's", best.VsRoundRobin)
		}
		var others []string
		for _, c := range cells[1:] {
			others = append(others, fmt.Sprintf("%s %.2f", c.Strategy, c.VsPlacement()))
		}
		if len(others) > 0 {
			line += "; then (÷ placement) " + strings.Join(others, ", ")
		}
		lines = append(lines, line)
	}
	return lines
}

// capacitySummary says how each strategy holds up as the capacity shrinks.
func (rep *Report) capacitySummary(b *strings.Builder, w *WorkloadInfo) {
	if len(w.Levels) <= 1 {
		return
	}
	name := w.Workload.Name
	hi, lo := w.Levels[len(w.Levels)-1], w.Levels[0]
	var parts []string
	for _, s := range rep.Options.Strategies {
		a, z := rep.Cell(name, hi.Capacity, s), rep.Cell(name, lo.Capacity, s)
		if a == nil || z == nil || !a.Available() || !z.Available() {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.3f → %.3f (÷ placement %.2f → %.2f)", s, a.HitRate, z.HitRate, a.VsPlacement(), z.VsPlacement()))
	}
	if len(parts) > 0 {
		fmt.Fprintf(b, "  From %s to %s capacity the placement reference goes %.3f → %.3f; hit rates: %s.\n",
			pct(hi.Capacity), pct(lo.Capacity), hi.PlacementHitRate, lo.PlacementHitRate, strings.Join(parts, "; "))
	}
}

// roundRobinSummary compares the placement reference at the goal capacity with the round-robin model
// and with live round robin.
func (rep *Report) roundRobinSummary(b *strings.Builder, w *WorkloadInfo) {
	lv := w.level(goalCapacity)
	if lv == nil || lv.RoundRobinHitRate <= 0 {
		return
	}
	fmt.Fprintf(b, "  At 50%% the placement reference is %.2f× the round-robin LRU model (%.3f vs %.3f)",
		lv.PlacementHitRate/lv.RoundRobinHitRate, lv.PlacementHitRate, lv.RoundRobinHitRate)
	if rr := rep.Cell(w.Workload.Name, goalCapacity, "round_robin"); rr != nil && rr.Available() {
		fmt.Fprintf(b, "; live round_robin measured %.3f", rr.HitRate)
	}
	b.WriteString(".\n")
}

// balanceSummary names the cells whose spread went above 1.5 or left an engine idle.
func (rep *Report) balanceSummary(b *strings.Builder, w *WorkloadInfo) {
	var unbalanced []string
	for _, lv := range w.Levels {
		for _, c := range rep.availableAt(w.Workload.Name, lv.Capacity) {
			sp := c.Load
			what := "requests"
			if c.Burst != nil {
				sp, what = *c.Burst, "burst requests"
			}
			if sp.Idle > 0 || sp.BusiestIdlest < 0 || sp.BusiestIdlest > 1.5 {
				s := fmt.Sprintf("%s at %s (%s busiest/idlest %s", c.Strategy, pct(lv.Capacity), what, loadtest.FormatMaxMin(sp.BusiestIdlest))
				if sp.Idle > 0 {
					s += fmt.Sprintf(", %d idle", sp.Idle)
				}
				unbalanced = append(unbalanced, s+")")
			}
		}
	}
	if len(unbalanced) > 0 {
		fmt.Fprintf(b, "  Spread above 1.5 or an idle engine: %s.\n", strings.Join(unbalanced, "; "))
	} else {
		b.WriteString("  Every cell kept busiest/idlest at or below 1.5 with no idle engine.\n")
	}
}

// ttftSummary sets TTFT against hit rate at the goal capacity: the fastest and the slowest cell.
func (rep *Report) ttftSummary(b *strings.Builder, w *WorkloadInfo) {
	cells := rep.availableAt(w.Workload.Name, goalCapacity)
	if len(cells) <= 1 {
		return
	}
	sort.SliceStable(cells, func(i, j int) bool { return cells[i].TTFT.P50 < cells[j].TTFT.P50 })
	f, s := cells[0], cells[len(cells)-1]
	fmt.Fprintf(b, "  TTFT p50 at 50%%: lowest %s %.0f ms (hit %.3f), highest %s %.0f ms (hit %.3f); p99 %.0f vs %.0f ms.\n",
		f.Strategy, f.TTFT.P50, f.HitRate, s.Strategy, s.TTFT.P50, s.HitRate, f.TTFT.P99, s.TTFT.P99)
}

// recommendedSummary writes the recommended strategy's own evidence at the goal capacity: its overloaded
// decisions, its claims, its tries and its evictions.
func (rep *Report) recommendedSummary(b *strings.Builder, w *WorkloadInfo) {
	c := rep.Cell(w.Workload.Name, goalCapacity, rep.Options.Recommended)
	if c == nil || !c.Available() || c.Succeeded <= 0 {
		return
	}
	over := c.Decisions["overloaded"]
	fmt.Fprintf(b, "  %s at 50%%: %d of %d decisions (%.0f%%) were `overloaded` (the holder was over the overload rule)",
		c.Strategy, over, c.Succeeded, 100*float64(over)/float64(c.Succeeded))
	if t := c.ByDecision["overloaded"]; t.PromptTokens > 0 {
		p := c.ByDecision["prefix_hit"]
		fmt.Fprintf(b, " and hit %.2f of their tokens (`prefix_hit` %.2f); they were %.0f%% of the prompt tokens",
			float64(t.CachedTokens)/float64(t.PromptTokens), div(float64(p.CachedTokens), float64(p.PromptTokens)),
			100*float64(t.PromptTokens)/float64(c.EnginePromptTokens))
	}
	if c.Claims.PrefixHits > 0 {
		fmt.Fprintf(b, "; of its %d `prefix_hit`s %d (%.0f%%) got less than half the predicted reuse and %d none (predicted %.2f, delivered %.2f on average)",
			c.Claims.PrefixHits, c.Claims.Stale, 100*float64(c.Claims.Stale)/float64(c.Claims.PrefixHits), c.Claims.Missed,
			c.Claims.Predicted, c.Claims.Delivered)
	}
	fmt.Fprintf(b, "; tries reset %s, pruned %d prompts; %d groups on more than one engine (%.2f engines each); %d blocks evicted.\n",
		formatResets(c.TrieResets), c.TrieEvictions, c.GroupsSplit, c.EnginesPerGroup, sum(c.Evictions))
}

// noiseSummary flags the cells measured while other processes kept the machine busy.
func (rep *Report) noiseSummary(b *strings.Builder) {
	noisy, measured := 0, 0
	worst, total := 0.0, 0.0
	for _, c := range rep.Cells {
		if !c.Available() || c.OtherCPU < 0 {
			continue
		}
		measured++
		if c.OtherCPU > noisyCPU {
			noisy++
			worst = max(worst, c.OtherCPU)
			total += c.OtherCPU
		}
	}
	if noisy > 0 {
		fmt.Fprintf(b, "- **Noise**: %d of %d cells ran while other processes kept more than %.1f CPUs busy (%.2f on average among them, at\n", noisy, measured, noisyCPU, total/float64(noisy))
		fmt.Fprintf(b, "  most %.2f; the *other CPUs* column). Their latencies are inflated and compare only roughly; hit rates do not depend on it.\n", worst)
	}
}
