package fleet

import (
	"fmt"
	"math"

	"github.com/rolter-ai/rolter/engine"
	"github.com/rolter-ai/rolter/loadtest"
)

// ReuseSummary is the routing evidence of a run, summed over the route's targets: the prompt reuse the
// strategy predicted - in its unit, prompt-key bytes or tokens - and what the engines delivered, over the
// same measured responses.
type ReuseSummary struct {
	Scored       uint64 `json:"scored"`
	Held         uint64 `json:"held"`
	Captured     uint64 `json:"captured"`
	PromptTokens uint64 `json:"prompt_tokens"`
	CachedTokens uint64 `json:"cached_tokens"`
	Measured     uint64 `json:"measured"`
}

// ReuseOf sums the gateway's routing evidence.
func ReuseOf(st engine.State) (r ReuseSummary) {
	for _, rt := range st.Routes {
		for _, t := range rt.Targets {
			r.Scored += t.Reuse.Scored
			r.Held += t.Reuse.Held
			r.Captured += t.Reuse.Captured
			r.PromptTokens += t.PromptTokens
			r.CachedTokens += t.CachedTokens
			r.Measured += t.Measured
		}
	}
	return r
}

// String is "held 0.88, captured 0.84; delivered 0.80", or the delivered part alone for a strategy that
// predicts nothing.
func (r ReuseSummary) String() string {
	delivered := "delivered -"
	if r.PromptTokens > 0 {
		delivered = fmt.Sprintf("delivered %.3f", float64(r.CachedTokens)/float64(r.PromptTokens))
	}
	if r.Scored == 0 {
		return delivered
	}
	return fmt.Sprintf("held %.3f, captured %.3f; %s", float64(r.Held)/float64(r.Scored), float64(r.Captured)/float64(r.Scored), delivered)
}

// GroupSpread counts the groups (shared-prefix) or users (multi-turn) whose requests went to
// more than one engine, and the mean number of distinct engines per group.
func GroupSpread(samples []loadtest.Sample) (split int, mean float64) {
	engines := map[int]map[string]bool{}
	for _, s := range samples {
		if s.Group < 0 || s.Target == "" || s.Error != "" {
			continue
		}
		if engines[s.Group] == nil {
			engines[s.Group] = map[string]bool{}
		}
		engines[s.Group][s.Target] = true
	}
	if len(engines) == 0 {
		return 0, 0
	}
	total := 0
	for _, e := range engines {
		total += len(e)
		if len(e) > 1 {
			split++
		}
	}
	return split, float64(total) / float64(len(engines))
}

// Spread returns max/min of counts (-1 when one is 0 and another is not; 0 when all are 0) and
// their coefficient of variation.
func Spread(counts []int) (maxMin, cov float64) {
	if len(counts) == 0 {
		return 0, 0
	}
	lo, hi, sum := counts[0], counts[0], 0.0
	for _, c := range counts {
		lo, hi = min(lo, c), max(hi, c)
		sum += float64(c)
	}
	if hi == 0 {
		return 0, 0
	}
	mean := sum / float64(len(counts))
	v := 0.0
	for _, c := range counts {
		v += (float64(c) - mean) * (float64(c) - mean)
	}
	cov = math.Sqrt(v/float64(len(counts))) / mean
	if lo == 0 {
		return -1, cov
	}
	return float64(hi) / float64(lo), cov
}
