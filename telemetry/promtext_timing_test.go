package telemetry

import (
	"bytes"
	"sync/atomic"
	"testing"
)

// Sink keeps benchmark results alive.
var Sink atomic.Uint64

// benchLines are the vLLM line shapes a scrape sees most: a gauge, a counter, its _created companion,
// a histogram bucket and a process metric.
var benchLines = [][]byte{
	[]byte(`vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 7.0`),
	[]byte(`vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 307200.0`),
	[]byte(`vllm:prefix_cache_queries_created{engine="0",model_name="Qwen/Qwen3-0.6B"} 1.7959912075337791e+09`),
	[]byte(`vllm:time_to_first_token_seconds_bucket{engine="1",le="0.25",model_name="Qwen/Qwen3-0.6B"} 3.0`),
	[]byte(`process_resident_memory_bytes 2.3138304e+07`),
}

func BenchmarkParseLine(b *testing.B) {
	n := 0
	for _, line := range benchLines {
		n += len(line)
	}
	b.ReportAllocs()
	b.SetBytes(int64(n))
	var s Sample
	var sum uint64
	for i := 0; i < b.N; i++ {
		for _, line := range benchLines {
			ok, _ := ParseLine(line, &s)
			if ok {
				sum += uint64(len(s.Name))
			}
		}
	}
	Sink.Add(sum)
}

func BenchmarkSampleLabel(b *testing.B) {
	var s Sample
	if ok, _ := ParseLine(benchLines[3], &s); !ok {
		b.Fatalf("cannot parse %q", benchLines[3])
	}
	b.ReportAllocs()
	var sum uint64
	for i := 0; i < b.N; i++ {
		v, _ := s.Label("model_name")
		sum += uint64(len(v))
	}
	Sink.Add(sum)
}

func benchmarkBody(b *testing.B, name string, f func(body []byte) uint64) {
	body := readFixture(b, name)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	b.ReportMetric(float64(bytes.Count(body, []byte("\n"))), "lines/body")
	b.ResetTimer()
	var sum uint64
	for i := 0; i < b.N; i++ {
		sum += f(body)
	}
	Sink.Add(sum)
}

func BenchmarkScannerBody(b *testing.B) {
	var sc Scanner
	benchmarkBody(b, "vllm_metrics.txt", func(body []byte) uint64 {
		sc.Init(body)
		n := uint64(0)
		for sc.Next() {
			n++
		}
		return n
	})
}
