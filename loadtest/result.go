package loadtest

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"
)

// Result is the measurement of one run. Times are in milliseconds, rates per second.
type Result struct {
	Scenario    string   `json:"scenario"`
	Workload    Workload `json:"workload"`
	URL         string   `json:"url"`
	Mode        string   `json:"mode"` // "closed" (Concurrency in flight) or "open" (Rate per second)
	Rate        float64  `json:"rate,omitempty"`
	Concurrency int      `json:"concurrency"`
	Stream      bool     `json:"stream"`
	TokenIDs    bool     `json:"token_ids"`

	Planned   int            `json:"planned"`
	Sent      int            `json:"sent"`
	Succeeded int            `json:"succeeded"`
	Failed    int            `json:"failed"`
	Cancelled int            `json:"cancelled"` // in flight when Duration ran out
	Errors    map[string]int `json:"errors,omitempty"`
	Statuses  map[string]int `json:"statuses,omitempty"`

	WallSeconds  float64 `json:"wall_seconds"` // first request start to last request end
	Throughput   float64 `json:"throughput_rps"`
	OutputTokens int64   `json:"output_tokens"`
	OutputTPS    float64 `json:"output_tokens_per_second"`
	TTFT         Dist    `json:"ttft_ms"` // time to the first response body byte
	Latency      Dist    `json:"latency_ms"`

	PromptTokens    int64   `json:"prompt_tokens"`
	CachedTokens    int64   `json:"cached_tokens"`
	HitRate         float64 `json:"token_hit_rate"` // cached / prompt tokens of succeeded requests
	OracleHitRate   float64 `json:"oracle_hit_rate"`
	OracleHitTokens int64   `json:"oracle_hit_tokens"`
	OraclePrompt    int64   `json:"oracle_prompt_tokens"`
	// OracleBlocks is the number of distinct full KV blocks the prompts sent make up: the
	// working set a fleet would need to hold to reach the oracle bound.
	OracleBlocks int `json:"oracle_blocks"`
	// OracleReused is the number of those blocks a later prompt hits: the reusable working set.
	OracleReused int     `json:"oracle_reused_blocks"`
	HitVsOracle  float64 `json:"hit_rate_vs_oracle"`
	// CapacityOracleBlocks is Options.OracleCapacity; when > 0, CapacityOracleHitRate is what
	// one pooled LRU cache of that many blocks hits (CapacityOracle) and HitVsCapacityOracle the
	// ratio to it.
	CapacityOracleBlocks  int     `json:"capacity_oracle_blocks,omitempty"`
	CapacityOracleHitRate float64 `json:"capacity_oracle_hit_rate,omitempty"`
	HitVsCapacityOracle   float64 `json:"hit_rate_vs_capacity_oracle,omitempty"`

	Targets []TargetStat `json:"targets,omitempty"`
	// ShareMaxMin is max/min requests per target; -1 when an expected target got none, 0 when no
	// response named a target (no gateway in front).
	ShareMaxMin float64        `json:"share_max_min"`
	Decisions   map[string]int `json:"decisions,omitempty"`

	Samples []Sample `json:"samples,omitempty"`
}

// TargetStat is one target's part of a run.
type TargetStat struct {
	Name         string  `json:"name"`
	Requests     int     `json:"requests"`
	Share        float64 `json:"share"`
	PromptTokens int64   `json:"prompt_tokens"`
	CachedTokens int64   `json:"cached_tokens"`
	HitRate      float64 `json:"token_hit_rate"`
	TTFTP50      float64 `json:"ttft_p50_ms"`
}

// Dist summarises a set of durations in milliseconds; percentiles are exact (nearest rank).
type Dist struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

// NewDist summarises vs (which it sorts).
func NewDist(vs []float64) Dist {
	if len(vs) == 0 {
		return Dist{}
	}
	sort.Float64s(vs)
	sum := 0.0
	for _, v := range vs {
		sum += v
	}
	return Dist{
		N: len(vs), Mean: sum / float64(len(vs)),
		P50: Percentile(vs, 0.50), P90: Percentile(vs, 0.90), P99: Percentile(vs, 0.99), Max: vs[len(vs)-1],
	}
}

// Percentile returns the nearest-rank q-quantile (0 < q <= 1) of sorted values, or 0 for none.
func Percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Shares returns per-target request counts and max/min over them. expected names targets that
// must be counted even with no request (then max/min is -1); with no names at all it is 0.
func Shares(counts map[string]int, expected []string) (names []string, maxMin float64) {
	all := map[string]int{}
	for _, n := range expected {
		all[n] = 0
	}
	for n, c := range counts {
		if n != "" {
			all[n] += c
		}
	}
	if len(all) == 0 {
		return nil, 0
	}
	lo, hi := math.MaxInt, 0
	for n, c := range all {
		names = append(names, n)
		lo, hi = min(lo, c), max(hi, c)
	}
	sort.Strings(names)
	if lo == 0 {
		return names, -1
	}
	return names, float64(hi) / float64(lo)
}

// result aggregates the samples of a finished run.
func (r *run) result(samples []Sample) *Result {
	o := &r.opts
	res := &Result{
		Scenario: o.Workload.Scenario, Workload: r.plan.Workload, URL: o.URL, Mode: "closed",
		Concurrency: o.Concurrency, Stream: !o.NonStream, TokenIDs: o.TokenIDs, Planned: r.limit,
		Errors: map[string]int{}, Statuses: map[string]int{}, Decisions: map[string]int{},
	}
	if o.Rate > 0 {
		res.Mode, res.Rate = "open", o.Rate
	}
	sort.Slice(samples, func(i, j int) bool { return samples[i].Index < samples[j].Index })
	var ttft, lat []float64
	var first, last time.Time
	counts := map[string]int{}
	perTarget := map[string]*TargetStat{}
	perTargetTTFT := map[string][]float64{}
	for i := range samples {
		s := &samples[i]
		res.Sent++
		res.Statuses[fmt.Sprint(s.Status)]++
		if first.IsZero() || s.start.Before(first) {
			first = s.start
		}
		if s.end.After(last) {
			last = s.end
		}
		switch {
		case s.Error != "" && s.cancelled:
			res.Cancelled++
			continue
		case s.Error != "":
			res.Failed++
			res.Errors[errorKind(s.Error)]++
			continue
		}
		res.Succeeded++
		ttft = append(ttft, s.TTFTMs)
		lat = append(lat, s.LatencyMs)
		res.PromptTokens += int64(s.PromptTokens)
		res.CachedTokens += int64(s.CachedTokens)
		res.OutputTokens += int64(s.OutputTokens)
		if s.Decision != "" {
			res.Decisions[s.Decision]++
		}
		if s.Target != "" {
			counts[s.Target]++
			ts := perTarget[s.Target]
			if ts == nil {
				ts = &TargetStat{Name: s.Target}
				perTarget[s.Target] = ts
			}
			ts.Requests++
			ts.PromptTokens += int64(s.PromptTokens)
			ts.CachedTokens += int64(s.CachedTokens)
			perTargetTTFT[s.Target] = append(perTargetTTFT[s.Target], s.TTFTMs)
		}
	}
	for i := range samples {
		samples[i].StartMs = ms(samples[i].start.Sub(first))
	}
	if !first.IsZero() && last.After(first) {
		res.WallSeconds = last.Sub(first).Seconds()
		res.Throughput = float64(res.Succeeded) / res.WallSeconds
		res.OutputTPS = float64(res.OutputTokens) / res.WallSeconds
	}
	res.TTFT, res.Latency = NewDist(ttft), NewDist(lat)
	if res.PromptTokens > 0 {
		res.HitRate = float64(res.CachedTokens) / float64(res.PromptTokens)
	}

	// The oracle sees the prompts that were sent, in the order the targeter built them.
	oracle := NewOracle(o.BlockSize)
	var capOracle *CapacityOracle
	if o.OracleCapacity > 0 {
		capOracle = NewCapacityOracle(o.BlockSize, o.OracleCapacity)
	}
	r.mu.Lock()
	var tokens []uint32
	for _, s := range r.sent {
		tokens = appendChatTokens(tokens[:0], s.msgs)
		oracle.AddTokens(tokens)
		if capOracle != nil {
			capOracle.AddTokens(tokens)
		}
	}
	r.mu.Unlock()
	if capOracle != nil {
		res.CapacityOracleBlocks = o.OracleCapacity
		res.CapacityOracleHitRate = capOracle.HitRate()
		if res.CapacityOracleHitRate > 0 {
			res.HitVsCapacityOracle = res.HitRate / res.CapacityOracleHitRate
		}
	}
	res.OraclePrompt, res.OracleHitTokens = oracle.Totals()
	res.OracleHitRate = oracle.HitRate()
	res.OracleBlocks = oracle.Blocks()
	res.OracleReused = oracle.ReusedBlocks()
	if res.OracleHitRate > 0 {
		res.HitVsOracle = res.HitRate / res.OracleHitRate
	}

	names, maxMin := Shares(counts, o.Targets)
	res.ShareMaxMin = maxMin
	for _, n := range names {
		ts := perTarget[n]
		if ts == nil {
			ts = &TargetStat{Name: n}
		}
		if res.Succeeded > 0 {
			ts.Share = float64(ts.Requests) / float64(res.Succeeded)
		}
		if ts.PromptTokens > 0 {
			ts.HitRate = float64(ts.CachedTokens) / float64(ts.PromptTokens)
		}
		v := perTargetTTFT[n]
		if len(v) > 0 {
			ts.TTFTP50 = NewDist(v).P50
		}
		res.Targets = append(res.Targets, *ts)
	}
	if o.KeepSamples {
		res.Samples = samples
	}
	return res
}

// errorKind shortens an error to a stable key: numbers and addresses vary per request.
func errorKind(s string) string {
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}

// WriteJSON writes r as indented JSON.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("cannot write result JSON: %w", err)
	}
	return nil
}

// FormatMaxMin renders a max/min ratio: "1.08", "∞ (idle target)" for -1, "-" for 0.
func FormatMaxMin(v float64) string {
	switch {
	case v < 0:
		return "∞ (idle target)"
	case v == 0:
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

// Markdown renders r as Markdown tables: the run, then one row per target.
func (r *Result) Markdown() string {
	var b strings.Builder
	w := r.Workload
	fmt.Fprintf(&b, "### %s against %s\n\n", r.Scenario, r.URL)
	load := fmt.Sprintf("closed loop, %d in flight", r.Concurrency)
	if r.Mode == "open" {
		load = fmt.Sprintf("open loop, %.4g req/s (at most %d in flight)", r.Rate, r.Concurrency)
	}
	fmt.Fprintf(&b, "| | |\n|---|---|\n")
	fmt.Fprintf(&b, "| workload | %s |\n", describeWorkload(w))
	fmt.Fprintf(&b, "| load | %s, stream %v, token ids %v |\n", load, r.Stream, r.TokenIDs)
	fmt.Fprintf(&b, "| requests | %d planned, %d sent, %d ok, %d failed, %d cancelled |\n", r.Planned, r.Sent, r.Succeeded, r.Failed, r.Cancelled)
	fmt.Fprintf(&b, "| wall time | %.2f s |\n", r.WallSeconds)
	fmt.Fprintf(&b, "| throughput | %.1f req/s, %.0f output tok/s |\n", r.Throughput, r.OutputTPS)
	fmt.Fprintf(&b, "| TTFT (first body byte) | p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms |\n", r.TTFT.P50, r.TTFT.P90, r.TTFT.P99, r.TTFT.Max)
	fmt.Fprintf(&b, "| latency | p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms |\n", r.Latency.P50, r.Latency.P90, r.Latency.P99, r.Latency.Max)
	fmt.Fprintf(&b, "| token hit rate | %.3f (%d of %d prompt tokens cached) |\n", r.HitRate, r.CachedTokens, r.PromptTokens)
	fmt.Fprintf(&b, "| oracle bound | %.3f (ratio %.3f) |\n", r.OracleHitRate, r.HitVsOracle)
	fmt.Fprintf(&b, "| share max/min | %s |\n", FormatMaxMin(r.ShareMaxMin))
	if len(r.Decisions) > 0 {
		fmt.Fprintf(&b, "| decisions | %s |\n", formatCounts(r.Decisions))
	}
	if len(r.Errors) > 0 {
		fmt.Fprintf(&b, "| errors | %s |\n", strings.ReplaceAll(formatCounts(r.Errors), "|", "\\|"))
	}
	if len(r.Targets) > 0 {
		fmt.Fprintf(&b, "\n| target | requests | share | token hit rate | TTFT p50 ms |\n|---|---:|---:|---:|---:|\n")
		for _, t := range r.Targets {
			fmt.Fprintf(&b, "| %s | %d | %.3f | %.3f | %.1f |\n", t.Name, t.Requests, t.Share, t.HitRate, t.TTFTP50)
		}
	}
	return b.String()
}

// formatCounts renders "a 3, b 1" with the largest first.
func formatCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// describeWorkload renders the knobs a scenario uses.
func describeWorkload(w Workload) string {
	switch w.Scenario {
	case SharedPrefix:
		return fmt.Sprintf("shared-prefix: %d groups × %d prompts, %d/%d/%d system/question/output tokens, %s popularity, seed %d",
			w.Groups, w.PromptsPerGroup, w.SystemTokens, w.QuestionTokens, w.OutputTokens, w.Popularity, w.Seed)
	case MultiTurn:
		return fmt.Sprintf("multi-turn: %d users × %d rounds, %d shared system + %d history tokens, %d question / %d output tokens per round, seed %d",
			w.Users, w.Rounds, w.SystemTokens, w.HistoryTokens, w.QuestionTokens, w.OutputTokens, w.Seed)
	case HotPrefix:
		return fmt.Sprintf("hot-prefix: %d requests, %d-token shared prefix, %d unique / %d output tokens, seed %d",
			w.Requests, w.SystemTokens, w.QuestionTokens, w.OutputTokens, w.Seed)
	case Random:
		return fmt.Sprintf("random: %d requests, %d prompt / %d output tokens, seed %d", w.Requests, w.QuestionTokens, w.OutputTokens, w.Seed)
	}
	return w.Scenario
}
