package telemetry

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseEngineLoad(t *testing.T) {
	f := func(body, model string, want LoadSample) {
		t.Helper()
		got, err := ParseEngineLoad([]byte(body), model)
		if err != nil {
			t.Fatalf("ParseEngineLoad: %s\nbody:\n%s", err, body)
		}
		if got.Running != want.Running || got.Waiting != want.Waiting || got.Source != want.Source ||
			!(sameFloat(got.KVUsage, want.KVUsage) || math.Abs(got.KVUsage-want.KVUsage) < 1e-12) {
			t.Fatalf("ParseEngineLoad = %+v; want %+v\nbody:\n%s", got, want, body)
		}
	}
	nan := math.NaN()

	// Real-looking output: two vLLM engines (DP=2) are summed, KV usage is their mean.
	f(string(readFixture(t, "vllm_metrics.txt")), "", LoadSample{Running: 12, Waiting: 3, KVUsage: (0.4321 + 0.25) / 2, Source: "vllm"})
	f(string(readFixture(t, "vllm_metrics.txt")), "Qwen/Qwen3-0.6B", LoadSample{Running: 12, Waiting: 3, KVUsage: (0.4321 + 0.25) / 2, Source: "vllm"})
	f(string(readFixture(t, "sglang_metrics.txt")), "", LoadSample{Running: 20, Waiting: 6, KVUsage: 0.5, Source: "sglang"})
	f(string(readFixture(t, "sglang_metrics.txt")), "meta-llama/Llama-3.1-8B-Instruct", LoadSample{Running: 20, Waiting: 6, KVUsage: 0.5, Source: "sglang"})

	// TV9 has KV usage but no queue gauges; adding them gives a full sample.
	f(tv9+"vllm:num_requests_running{engine=\"0\",model_name=\"Qwen/Qwen3-0.6B\"} 2.0\n", "", LoadSample{Running: 2, Waiting: 0, KVUsage: 0.25, Source: "vllm"})

	// llm-d-inference-sim style: only model_name, any label order, CRLF.
	f("vllm:num_requests_running{model_name=\"m\"} 4\r\nvllm:num_requests_waiting{model_name=\"m\"} 9\r\n", "m", LoadSample{Running: 4, Waiting: 9, KVUsage: nan, Source: "vllm"})
	f("vllm:num_requests_waiting{model_name=\"m\",engine=\"0\"} 1\nvllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 2\n", "", LoadSample{Running: 0, Waiting: 3, KVUsage: nan, Source: "vllm"})

	// vLLM wins when both families are present.
	f("sglang:num_running_reqs 50\nsglang:num_queue_reqs 50\nvllm:num_requests_running 1\n", "", LoadSample{Running: 1, Waiting: 0, KVUsage: nan, Source: "vllm"})

	// Filtering by model_name; series without the label still count.
	two := "vllm:num_requests_running{model_name=\"a\"} 1\nvllm:num_requests_running{model_name=\"b\"} 10\n" +
		"vllm:num_requests_waiting{model_name=\"a\"} 2\nvllm:num_requests_waiting{model_name=\"b\"} 20\n" +
		"vllm:kv_cache_usage_perc{model_name=\"a\"} 0.1\nvllm:kv_cache_usage_perc{model_name=\"b\"} 0.9\n"
	f(two, "a", LoadSample{Running: 1, Waiting: 2, KVUsage: 0.1, Source: "vllm"})
	f(two, "b", LoadSample{Running: 10, Waiting: 20, KVUsage: 0.9, Source: "vllm"})
	f(two, "", LoadSample{Running: 11, Waiting: 22, KVUsage: 0.5, Source: "vllm"})
	f("vllm:num_requests_running 3\n", "a", LoadSample{Running: 3, Waiting: 0, KVUsage: nan, Source: "vllm"})
	f("vllm:num_requests_running{model_name=\"a \\\"q\\\"\"} 3\n", `a "q"`, LoadSample{Running: 3, Waiting: 0, KVUsage: nan, Source: "vllm"})

	// Older vLLM: gpu_cache_usage_perc only when kv_cache_usage_perc is absent.
	f("vllm:num_requests_running 1\nvllm:gpu_cache_usage_perc 0.7\n", "", LoadSample{Running: 1, Waiting: 0, KVUsage: 0.7, Source: "vllm"})
	f("vllm:num_requests_running 1\nvllm:gpu_cache_usage_perc 0.7\nvllm:kv_cache_usage_perc 0.2\n", "", LoadSample{Running: 1, Waiting: 0, KVUsage: 0.2, Source: "vllm"})

	// NaN and Inf are skipped, negatives clamp to zero, fractions round.
	f("vllm:num_requests_running NaN\nvllm:num_requests_running 2\nvllm:num_requests_waiting +Inf\nvllm:num_requests_waiting 1.6\n", "", LoadSample{Running: 2, Waiting: 2, KVUsage: nan, Source: "vllm"})
	f("vllm:num_requests_running -3\nvllm:num_requests_waiting 0\n", "", LoadSample{Running: 0, Waiting: 0, KVUsage: nan, Source: "vllm"})

	// Garbage lines, _created lines and other families around the load series are tolerated.
	f("garbage here\nvllm:num_requests_running{engine=\"0\"} 5\nvllm:num_requests_running_created 1.7e9\n<html>\nvllm:num_requests_waiting_by_reason{reason=\"capacity\"} 40\nvllm:num_requests_waiting 4 1700000000000\n", "", LoadSample{Running: 5, Waiting: 4, KVUsage: nan, Source: "vllm"})
}

func TestParseEngineLoadError(t *testing.T) {
	f := func(body, model, wantErr string) {
		t.Helper()
		_, err := ParseEngineLoad([]byte(body), model)
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("ParseEngineLoad(%q) error = %v; want one containing %q", body, err, wantErr)
		}
	}
	f("", "", "cannot find engine load series")
	f(tv9, "", "cannot find engine load series")
	f("# TYPE a gauge\nprocess_open_fds 6\n", "", "cannot find engine load series")
	f("<html>\n<body>404</body>\n</html>\n", "", "among 3 garbage lines")
	f("vllm:num_requests_running{model_name=\"a\"} 1\n", "b", `for model_name "b"`)
	f("vllm:num_requests_running NaN\n", "", "cannot find engine load series")
}

func TestEngineLoad(t *testing.T) {
	var l EngineLoad
	f := func(now, maxAge, wantRunning, wantWaiting int64, wantOK bool) {
		t.Helper()
		r, w, ok := l.Queue(now, maxAge)
		if r != wantRunning || w != wantWaiting || ok != wantOK {
			t.Fatalf("Queue(%d, %d) = %d, %d, %v; want %d, %d, %v", now, maxAge, r, w, ok, wantRunning, wantWaiting, wantOK)
		}
	}
	f(0, 0, 0, 0, false) // never scraped
	l.Store(7, 3, 0.5, 1000)
	f(1000, 100, 7, 3, true)
	f(1099, 100, 7, 3, true)
	f(1100, 100, 0, 0, false) // stale
	f(5000, 100, 0, 0, false)
	f(900, 100, 7, 3, true) // a caller clock slightly behind is not "stale"
	f(1<<62, 0, 7, 3, true) // maxAge <= 0: no age check
	if u, ok := l.KVUsage(1000, 100); !ok || u != 0.5 {
		t.Fatalf("KVUsage = %v, %v; want 0.5, true", u, ok)
	}
	if _, ok := l.KVUsage(1100, 100); ok {
		t.Fatalf("KVUsage of a stale scrape is ok")
	}
	l.Invalidate()
	f(1000, 100, 0, 0, false)
	f(1000, 0, 0, 0, false)
	l.Store(1, 2, math.NaN(), 2000)
	f(2000, 100, 1, 2, true)
	if _, ok := l.KVUsage(2000, 100); ok {
		t.Fatalf("KVUsage without a gauge is ok")
	}
}

// TestEngineLoadExternal: the engine's count beyond the caller's own in-flight requests at scrape time.
func TestEngineLoadExternal(t *testing.T) {
	var l EngineLoad
	now := time.Now().UnixNano()
	f := func(running, waiting, baseline, want int64) {
		t.Helper()
		l.baseline.Store(baseline)
		l.Store(running, waiting, 0.5, now)
		if got, ok := l.External(now, int64(time.Second)); !ok || got != want {
			t.Fatalf("External(%d+%d, baseline %d) = %d, %v; want %d", running, waiting, baseline, got, ok, want)
		}
	}
	f(8, 2, 0, 10)
	f(8, 2, 6, 4)
	f(3, 0, 5, 0) // the engine has not seen all of ours yet: never negative
	l.Invalidate()
	if _, ok := l.External(now, int64(time.Second)); ok {
		t.Fatal("invalid load reported")
	}
}

func TestParseStartTime(t *testing.T) {
	body := "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.7645e+09\nvllm:num_requests_running 1\n"
	ls, err := ParseEngineLoad([]byte(body), "")
	if err != nil || ls.StartTime != 1.7645e+09 {
		t.Fatalf("start time %v, %v", ls.StartTime, err)
	}
	if ls, _ := ParseEngineLoad([]byte("vllm:num_requests_running 1\n"), ""); ls.StartTime != 0 {
		t.Fatalf("start time %v without the series", ls.StartTime)
	}
}
