//go:build !race

package telemetry

import (
	"bytes"
	"strings"
	"testing"

	"github.com/valyala/fastjson"
)

func TestParseLineAllocs(t *testing.T) {
	lines := bytes.Split(readFixture(t, "vllm_metrics.txt"), []byte("\n"))
	lines = append(lines,
		[]byte(`g{path="C:\\dir\\",quote="say \"hi\""} NaN 1700000000000`),
		[]byte("g{a=\"b\"} -Inf\r\n"),
		[]byte(`h_bucket{le="0.5"} 3 # {trace_id="abc"} 0.4`),
	)
	var s Sample
	n := testing.AllocsPerRun(100, func() {
		for _, line := range lines {
			if _, err := ParseLine(line, &s); err != nil {
				t.Fatalf("ParseLine(%q): %s", line, err)
			}
		}
	})
	if n != 0 {
		t.Fatalf("ParseLine allocates %v times per fixture; want 0", n)
	}
}

func TestSampleLabelAllocs(t *testing.T) {
	var s Sample
	if ok, err := ParseLine([]byte(`g{engine="0",path="C:\\dir\\",model_name="Qwen/Qwen3-0.6B"} 1`), &s); !ok || err != nil {
		t.Fatalf("ParseLine: %v %v", ok, err)
	}
	s.Label("path") // grows the scratch buffer once
	n := testing.AllocsPerRun(100, func() {
		if v, ok := s.Label("model_name"); !ok || string(v) != "Qwen/Qwen3-0.6B" {
			t.Fatalf("model_name = %q", v)
		}
		if v, ok := s.Label("path"); !ok || string(v) != `C:\dir\` {
			t.Fatalf("path = %q", v)
		}
		if _, ok := s.Label("missing"); ok {
			t.Fatalf("found a missing label")
		}
	})
	if n != 0 {
		t.Fatalf("Label allocates %v times; want 0", n)
	}
}

func TestScannerAllocs(t *testing.T) {
	body := readFixture(t, "vllm_metrics.txt")
	var sc Scanner
	n := testing.AllocsPerRun(20, func() {
		sc.Init(body)
		for sc.Next() {
			sc.Sample().Label("engine")
		}
	})
	if n != 0 {
		t.Fatalf("a body scan allocates %v times; want 0", n)
	}
}

func TestParseEngineLoadAllocs(t *testing.T) {
	f := func(name, model string) {
		t.Helper()
		body := readFixture(t, name)
		var sc Scanner
		n := testing.AllocsPerRun(20, func() {
			if _, err := parseEngineLoad(&sc, body, model); err != nil {
				t.Fatalf("parseEngineLoad: %s", err)
			}
		})
		if n != 0 {
			t.Fatalf("parseEngineLoad(%s, %q) allocates %v times; want 0", name, model, n)
		}
		n = testing.AllocsPerRun(20, func() {
			if _, err := ParseEngineLoad(body, model); err != nil {
				t.Fatalf("ParseEngineLoad: %s", err)
			}
		})
		if n != 0 {
			t.Fatalf("ParseEngineLoad(%s, %q) allocates %v times; want 0", name, model, n)
		}
	}
	f("vllm_metrics.txt", "")
	f("vllm_metrics.txt", "Qwen/Qwen3-0.6B")
	f("sglang_metrics.txt", "meta-llama/Llama-3.1-8B-Instruct")
}

func TestStateAllocs(t *testing.T) {
	var l EngineLoad
	var cs CacheStatus
	n := testing.AllocsPerRun(100, func() {
		l.Store(1, 2, 0.5, 100)
		l.Queue(150, 100)
		l.KVUsage(150, 100)
		cs.Store(0.5, true, 100)
		cs.Get(150, 100)
	})
	if n != 0 {
		t.Fatalf("EngineLoad/CacheStatus allocate %v times; want 0", n)
	}
}

func TestParseCacheStatusAllocs(t *testing.T) {
	var p fastjson.Parser
	body := []byte(`{"occupancy":0.42,"cache_available":true,"instance_id":"vllm-001"}`)
	ParseCacheStatus(&p, body) // warm the parser
	n := testing.AllocsPerRun(100, func() {
		if _, _, err := ParseCacheStatus(&p, body); err != nil {
			t.Fatalf("ParseCacheStatus: %s", err)
		}
	})
	if n != 0 {
		t.Fatalf("ParseCacheStatus allocates %v times; want 0", n)
	}
}

func TestAdaptersReadAllocs(t *testing.T) {
	var a Adapters
	long := strings.Repeat("adapter-", 8) // past the runtime's 32-byte stack buffer for string(b)
	a.StoreBatch(LoRASample{Seen: true, MaxLoRA: 4, Running: []string{long, "sql-lora"}, Waiting: []string{"tool-lora"}}, 100)
	a.StoreModels(ModelList{Adapters: []AdapterCard{{Name: long, Parent: "base"}}}, 100)
	name := []byte(long)
	n := testing.AllocsPerRun(100, func() {
		if !a.Running(long, 150, 100) || !a.Registered(long, 150, 100) {
			t.Fatalf("adapter %q not found", long)
		}
		if st := a.Lookup(name, 150, 100); !st.Running || st.Waiting || !st.Registered {
			t.Fatalf("Lookup(%q) = %+v", name, st)
		}
		a.Waiting(long, 150, 100)
		a.MaxLoRA(150, 100)
		a.RunningCount(150, 100)
		a.View(150, 100)
	})
	if n != 0 {
		t.Fatalf("Adapters reads allocate %v times; want 0", n)
	}
}

func TestParseEngineLoadLoRABodyAllocs(t *testing.T) {
	// The LoRA series costs allocations only once per body, not per line: its names are copied after
	// the scan, so a body with many old label sets allocates as much as one with a single set.
	one := append(readFixture(t, "vllm_metrics.txt"), "vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"a,b\",waiting_lora_adapters=\"c\"} 9\n"...)
	many := one
	for range 50 {
		many = append(many, "vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"x,y\",waiting_lora_adapters=\"z\"} 1\n"...)
	}
	var sc Scanner
	count := func(body []byte) float64 {
		return testing.AllocsPerRun(20, func() {
			if _, err := parseEngineLoad(&sc, body, ""); err != nil {
				t.Fatalf("parseEngineLoad: %s", err)
			}
		})
	}
	if a, b := count(one), count(many); a != b || a == 0 {
		t.Fatalf("allocations: %v for one LoRA series, %v for 51; want the same, above 0", a, b)
	}
}
