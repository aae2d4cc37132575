package telemetry

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
)

// EngineLoad is the engine-side load of one target as last scraped from its /metrics: requests
// running, requests waiting and KV-cache usage. One Scraper writes it; routing reads it.
//
// All methods are safe for concurrent use and do not allocate. An EngineLoad must not be copied.
type EngineLoad struct {
	_         [padBytes]byte
	running   atomic.Int64
	waiting   atomic.Int64
	kvUsage   atomic.Uint64 // math.Float64bits; NaN when the engine does not expose it
	updatedAt atomic.Int64  // unix nanoseconds of the last successful scrape
	baseline  atomic.Int64  // the caller's own in-flight count when the scrape was read (ScrapeConfig.Baseline)
	valid     atomic.Bool
	_         [padBytes]byte
}

// Store records a successful scrape taken at now (unix nanoseconds). kvUsage may be NaN when the
// engine exposes no KV-cache usage.
func (l *EngineLoad) Store(running, waiting int64, kvUsage float64, now int64) {
	l.running.Store(running)
	l.waiting.Store(waiting)
	l.kvUsage.Store(math.Float64bits(kvUsage))
	l.updatedAt.Store(now)
	l.valid.Store(true)
}

// External returns how many of the engine's requests (running + waiting) are not the caller's own: the
// engine's count minus ScrapeConfig.Baseline sampled when the scrape was read, at least 0. ok follows the
// rule of Queue. It lets a gateway add other clients' load to its own fresh in-flight count without
// counting its own requests twice.
func (l *EngineLoad) External(now, maxAge int64) (int64, bool) {
	r, w, ok := l.Queue(now, maxAge)
	if !ok {
		return 0, false
	}
	return max(0, r+w-l.baseline.Load()), true
}

// Invalidate drops the current values: until the next Store, Queue and KVUsage report not ok.
// A failed scrape calls it at once, so routing never leans on a number the engine no longer vouches for.
func (l *EngineLoad) Invalidate() {
	l.valid.Store(false)
}

// Queue returns the engine's running and waiting request counts. ok is false, and the counts are
// zero, unless the last scrape succeeded and is younger than maxAge nanoseconds at now (unix
// nanoseconds); maxAge <= 0 disables the age check. The two counts are read one after the other, so
// when a scrape lands in between they may come from two consecutive scrapes.
func (l *EngineLoad) Queue(now, maxAge int64) (running, waiting int64, ok bool) {
	if !l.fresh(now, maxAge) {
		return 0, 0, false
	}
	return l.running.Load(), l.waiting.Load(), true
}

// KVUsage returns the engine's KV-cache usage (0..1) under the same freshness rule as Queue; ok is
// also false when the engine does not expose a usage gauge.
func (l *EngineLoad) KVUsage(now, maxAge int64) (usage float64, ok bool) {
	if !l.fresh(now, maxAge) {
		return 0, false
	}
	u := math.Float64frombits(l.kvUsage.Load())
	if math.IsNaN(u) {
		return 0, false
	}
	return u, true
}

func (l *EngineLoad) fresh(now, maxAge int64) bool {
	if !l.valid.Load() {
		return false
	}
	return maxAge <= 0 || now-l.updatedAt.Load() < maxAge
}

// LoadSample is the engine load read from one /metrics body.
type LoadSample struct {
	Running int64
	Waiting int64
	// KVUsage is the mean KV-cache usage (0..1) over the engines in the body, NaN when none is exposed.
	KVUsage float64
	// Source says which metric names were found: "vllm" or "sglang".
	Source string
	// StartTime is process_start_time_seconds (the Prometheus client's process collector, which vLLM and
	// SGLang serve), 0 when absent: a new value is a restarted engine, whose prefix cache is empty.
	StartTime float64
	// LoRA is the newest vllm:lora_requests_info series (lora.go); LoRA.Seen is false when the body has none.
	LoRA LoRASample
}

// ParseEngineLoad reads the engine load from a Prometheus text body (docs/internals/engine-metrics.md).
//
// vLLM names come first: vllm:num_requests_running, vllm:num_requests_waiting and
// vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc of older versions when the new gauge is absent).
// Only when no vLLM queue series is present are SGLang names used: sglang:num_running_reqs,
// sglang:num_queue_reqs and sglang:token_usage. Queue counts are summed over all matching series
// (several `engine` labels with data parallelism, several `dp_rank` for SGLang); KV usage is their
// mean. NaN and infinite values are skipped and negative sums count as zero.
//
// When modelName is not empty, series whose model_name label differs are skipped; series without a
// model_name label still count (they cannot belong to another model). A body without any queue series
// is an error. Garbage lines are skipped. The LoRA sample is read in the same pass (vLLM only; SGLang
// exposes no such series); its strings are copies that do not alias body.
func ParseEngineLoad(body []byte, modelName string) (LoadSample, error) {
	var sc Scanner
	return parseEngineLoad(&sc, body, modelName)
}

type loadSeries struct {
	sum float64
	n   int
}

func (s *loadSeries) mean() float64 {
	if s.n == 0 {
		return math.NaN()
	}
	return s.sum / float64(s.n)
}

func (s *loadSeries) count() int64 {
	return int64(max(0, math.Round(s.sum)))
}

func parseEngineLoad(sc *Scanner, body []byte, modelName string) (LoadSample, error) {
	var vRun, vWait, vKV, vGPU, sRun, sWait, sKV loadSeries
	otherModel := false
	start := 0.0
	var lora loraSeries
	sc.Init(body)
	for sc.Next() {
		s := sc.Sample()
		var dst *loadSeries
		switch string(s.Name) {
		case "process_start_time_seconds":
			if s.Value > 0 && !math.IsInf(s.Value, 0) {
				start = s.Value
			}
			continue
		case loraInfoName:
			lora.offer(s)
			continue
		case "vllm:num_requests_running":
			dst = &vRun
		case "vllm:num_requests_waiting":
			dst = &vWait
		case "vllm:kv_cache_usage_perc":
			dst = &vKV
		case "vllm:gpu_cache_usage_perc":
			// Deprecated in vLLM 0.10 and removed later (vllm-project/vllm#29330), still served by
			// older engines in the field.
			dst = &vGPU
		case "sglang:num_running_reqs":
			dst = &sRun
		case "sglang:num_queue_reqs":
			dst = &sWait
		case "sglang:token_usage":
			dst = &sKV
		default:
			continue
		}
		if math.IsNaN(s.Value) || math.IsInf(s.Value, 0) {
			continue
		}
		if modelName != "" {
			if m, ok := s.Label("model_name"); ok && string(m) != modelName {
				otherModel = true
				continue
			}
		}
		dst.sum += s.Value
		dst.n++
	}
	switch {
	case vRun.n > 0 || vWait.n > 0:
		kv := vKV.mean()
		if vKV.n == 0 {
			kv = vGPU.mean()
		}
		return LoadSample{Running: vRun.count(), Waiting: vWait.count(), KVUsage: kv, Source: "vllm", StartTime: start, LoRA: lora.sample()}, nil
	case sRun.n > 0 || sWait.n > 0:
		return LoadSample{Running: sRun.count(), Waiting: sWait.count(), KVUsage: sKV.mean(), Source: "sglang", StartTime: start}, nil
	}
	if otherModel {
		return LoadSample{}, fmt.Errorf("cannot find engine load series for model_name %q", modelName)
	}
	if err := sc.Err(); err != nil {
		return LoadSample{}, fmt.Errorf("cannot find engine load series (vllm:num_requests_* or sglang:num_*_reqs) among %d garbage lines: %w", sc.BadLines(), err)
	}
	return LoadSample{}, errNoLoadSeries
}

var errNoLoadSeries = errors.New("cannot find engine load series (vllm:num_requests_* or sglang:num_*_reqs)")
