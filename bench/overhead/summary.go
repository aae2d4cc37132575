package overhead

import (
	"sort"

	"github.com/rolter-ai/rolter/loadtest"
)

// PathRound is one path's measurements in one round of one case. Times in microseconds.
type PathRound struct {
	LatencyP50 float64 `json:"latency_p50_us"`
	LatencyP99 float64 `json:"latency_p99_us"`
	LatencyErr int     `json:"latency_errors"`
	// SparseP50 is the p50 at concurrency 1 of requests sent to the case's paths in turn, one each, so that
	// every process idles between two of its requests (sparse traffic); SparseErr its errors.
	SparseP50  float64 `json:"sparse_latency_p50_us"`
	SparseErr  int     `json:"sparse_latency_errors"`
	Throughput float64 `json:"throughput_rps"`
	TputP99    float64 `json:"throughput_p99_us"`
	TputErr    int     `json:"throughput_errors"`
	// CPU during the throughput run: ClientCPU and MachineCPU are the mean CPUs the load generator and the
	// whole machine kept busy (the machine has Machine.CPUs), OtherCPU what other work took of it: other
	// processes and the hypervisor's steal (machine − interrupt handling − load generator − gateway −
	// upstream); GatewayCPU the gateway process's CPU time per request (µs; 0 on the direct path). -1: not
	// measured (no /proc).
	ClientCPU  float64 `json:"client_cpus"`
	MachineCPU float64 `json:"machine_cpus"`
	OtherCPU   float64 `json:"other_cpus"`
	GatewayCPU float64 `json:"gateway_cpu_us_per_request"`
	// GatewaySwitches are the gateway's context switches (voluntary and not, all its threads) per request
	// during the throughput run: each is a thread that slept and had to be woken, or was preempted. -1: not
	// measured (no /proc).
	GatewaySwitches float64 `json:"gateway_switches_per_request"`
	TTFB            float64 `json:"stream_ttfb_us"` // median over the round's first-byte streams
	StreamErr       int     `json:"stream_errors"`
	// Gaps between consecutive deltas, and each delta's transit time (client receive time minus
	// the upstream's send stamp), pooled over the round's streams.
	Gaps    []float64 `json:"-"`
	Transit []float64 `json:"-"`
	// Jitter is |transit(i) − transit(i−1)| for consecutive deltas: how much the path itself
	// stretches or squeezes a gap, free of the upstream's own pacing jitter.
	Jitter []float64 `json:"-"`
}

// PathSummary is one path over all rounds of a case: medians of the round values, and percentiles of
// the pooled stream gaps and transits. Times in microseconds.
type PathSummary struct {
	Path       string  `json:"path"`
	LatencyP50 float64 `json:"latency_p50_us"`
	LatencyP99 float64 `json:"latency_p99_us"`
	SparseP50  float64 `json:"sparse_latency_p50_us"`
	Throughput float64 `json:"throughput_rps"`
	ClientCPU  float64 `json:"client_cpus"`
	MachineCPU float64 `json:"machine_cpus"`
	OtherCPU   float64 `json:"other_cpus"`
	GatewayCPU float64 `json:"gateway_cpu_us_per_request"`
	// GatewaySwitches: context switches per request (PathRound.GatewaySwitches).
	GatewaySwitches float64 `json:"gateway_switches_per_request"`
	TTFB            float64 `json:"stream_ttfb_us"`
	GapP50          float64 `json:"gap_p50_us"`
	GapP99          float64 `json:"gap_p99_us"`
	TransitP50      float64 `json:"transit_p50_us"`
	TransitP99      float64 `json:"transit_p99_us"`
	JitterP50       float64 `json:"jitter_p50_us"`
	JitterP99       float64 `json:"jitter_p99_us"`
	// GapTop are the largest gaps seen (µs), to tell a tail from a shift.
	GapTop []float64 `json:"gap_top_us"`
	// Gaps and transits pooled over all rounds.
	GapCount int `json:"gaps"`
	Errors   int `json:"errors"`
	// Added* are this path minus direct: medians over rounds of the per-round differences
	// (latency, TTFB), or differences of the pooled percentiles (gaps, transit).
	AddedP50     float64 `json:"added_latency_p50_us"`
	AddedP99     float64 `json:"added_latency_p99_us"`
	AddedSparse  float64 `json:"added_sparse_latency_p50_us"`
	AddedTTFB    float64 `json:"added_ttfb_us"`
	AddedGapP50  float64 `json:"added_gap_p50_us"`
	AddedGapP99  float64 `json:"added_gap_p99_us"`
	AddedTransit float64 `json:"added_transit_p50_us"`
	AddedTrP99   float64 `json:"added_transit_p99_us"`
	AddedJitP50  float64 `json:"added_jitter_p50_us"`
	AddedJitP99  float64 `json:"added_jitter_p99_us"`
}

// summarize fills c.Summary from its rounds.
func summarize(c *Case, paths []string) {
	if c.Summary == nil {
		c.Summary = map[string]*PathSummary{}
	}
	rs := rounds(c.Rounds)
	for _, p := range paths {
		c.Summary[p] = rs.summary(p)
	}
	d := c.Summary[PathDirect]
	for _, p := range paths {
		if p == PathDirect || d == nil {
			continue
		}
		rs.added(c.Summary[p], d)
	}
}

// rounds are a case's rounds, each by path.
type rounds []map[string]*PathRound

// summary returns path's medians over the rounds and the percentiles of its pooled stream samples.
func (rs rounds) summary(p string) *PathSummary {
	gaps := func(x *PathRound) []float64 { return x.Gaps }
	transit := func(x *PathRound) []float64 { return x.Transit }
	jitter := func(x *PathRound) []float64 { return x.Jitter }
	s := &PathSummary{Path: p}
	s.LatencyP50 = rs.median(func(x *PathRound) float64 { return x.LatencyP50 }, p)
	s.LatencyP99 = rs.median(func(x *PathRound) float64 { return x.LatencyP99 }, p)
	s.SparseP50 = rs.median(func(x *PathRound) float64 { return x.SparseP50 }, p)
	s.Throughput = rs.median(func(x *PathRound) float64 { return x.Throughput }, p)
	s.ClientCPU = rs.median(func(x *PathRound) float64 { return x.ClientCPU }, p)
	s.MachineCPU = rs.median(func(x *PathRound) float64 { return x.MachineCPU }, p)
	s.OtherCPU = rs.median(func(x *PathRound) float64 { return x.OtherCPU }, p)
	s.GatewayCPU = rs.median(func(x *PathRound) float64 { return x.GatewayCPU }, p)
	s.GatewaySwitches = rs.median(func(x *PathRound) float64 { return x.GatewaySwitches }, p)
	s.TTFB = rs.median(func(x *PathRound) float64 { return x.TTFB }, p)
	s.GapP50, s.GapP99 = rs.pooled(gaps, p, 0.5), rs.pooled(gaps, p, 0.99)
	s.TransitP50, s.TransitP99 = rs.pooled(transit, p, 0.5), rs.pooled(transit, p, 0.99)
	s.JitterP50, s.JitterP99 = rs.pooled(jitter, p, 0.5), rs.pooled(jitter, p, 0.99)
	var all []float64
	for _, r := range rs {
		if x := r[p]; x != nil {
			all = append(all, x.Gaps...)
			s.Errors += x.LatencyErr + x.SparseErr + x.TputErr + x.StreamErr
		}
	}
	sort.Sort(sort.Reverse(sort.Float64Slice(all)))
	s.GapCount = len(all)
	s.GapTop = append([]float64(nil), all[:min(5, len(all))]...)
	return s
}

// added fills s's Added* fields against the direct path's summary d.
func (rs rounds) added(s, d *PathSummary) {
	p := s.Path
	s.AddedP50 = rs.addedMedian(func(x *PathRound) float64 { return x.LatencyP50 }, p)
	s.AddedP99 = rs.addedMedian(func(x *PathRound) float64 { return x.LatencyP99 }, p)
	s.AddedSparse = rs.addedMedian(func(x *PathRound) float64 { return x.SparseP50 }, p)
	s.AddedTTFB = rs.addedMedian(func(x *PathRound) float64 { return x.TTFB }, p)
	s.AddedGapP50, s.AddedGapP99 = s.GapP50-d.GapP50, s.GapP99-d.GapP99
	s.AddedTransit, s.AddedTrP99 = s.TransitP50-d.TransitP50, s.TransitP99-d.TransitP99
	s.AddedJitP50, s.AddedJitP99 = s.JitterP50-d.JitterP50, s.JitterP99-d.JitterP99
}

// median is the median over the rounds of f of path's round.
func (rs rounds) median(f func(*PathRound) float64, path string) float64 {
	var v []float64
	for _, r := range rs {
		if x := r[path]; x != nil {
			v = append(v, f(x))
		}
	}
	sort.Float64s(v)
	return loadtest.Percentile(v, 0.5)
}

// addedMedian is the median over the rounds of f of path's round minus f of the direct path's.
func (rs rounds) addedMedian(f func(*PathRound) float64, path string) float64 {
	var v []float64
	for _, r := range rs {
		if x, d := r[path], r[PathDirect]; x != nil && d != nil {
			v = append(v, f(x)-f(d))
		}
	}
	sort.Float64s(v)
	return loadtest.Percentile(v, 0.5)
}

// pooled is the q-quantile of f's samples of path, pooled over the rounds.
func (rs rounds) pooled(f func(*PathRound) []float64, path string, q float64) float64 {
	var v []float64
	for _, r := range rs {
		if x := r[path]; x != nil {
			v = append(v, f(x)...)
		}
	}
	sort.Float64s(v)
	return loadtest.Percentile(v, q)
}
