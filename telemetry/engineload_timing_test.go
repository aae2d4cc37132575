package telemetry

import "testing"

func BenchmarkParseEngineLoad(b *testing.B) {
	var sc Scanner
	for _, bb := range []struct{ name, fixture, model string }{
		{"vllm", "vllm_metrics.txt", ""},
		{"vllm-model-filter", "vllm_metrics.txt", "Qwen/Qwen3-0.6B"},
		{"sglang", "sglang_metrics.txt", ""},
	} {
		b.Run(bb.name, func(b *testing.B) {
			benchmarkBody(b, bb.fixture, func(body []byte) uint64 {
				ls, _ := parseEngineLoad(&sc, body, bb.model)
				return uint64(ls.Running + ls.Waiting)
			})
		})
	}
}

func BenchmarkEngineLoadQueue(b *testing.B) {
	var l EngineLoad
	l.Store(7, 3, 0.5, 1)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var sum uint64
		for pb.Next() {
			r, w, _ := l.Queue(2, 1000)
			sum += uint64(r + w)
		}
		Sink.Add(sum)
	})
}
