package telemetry

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// vllmLoRASeries is what vLLM's gauge_lora_info exposes after a few scheduler steps: prometheus_client
// keeps every label set it has seen, each with the time it was last set.
const vllmLoRASeries = `# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7959912e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora",waiting_lora_adapters=""} 1.79599125e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora,chat-lora",waiting_lora_adapters="tool-lora"} 1.79599131e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="chat-lora",waiting_lora_adapters="sql-lora"} 1.79599129e+09
`

func TestParseEngineLoadLoRA(t *testing.T) {
	base := string(readFixture(t, "vllm_metrics.txt"))
	f := func(series string, want LoRASample) {
		t.Helper()
		ls, err := ParseEngineLoad([]byte(base+series), "Qwen/Qwen3-0.6B")
		if err != nil {
			t.Fatalf("ParseEngineLoad: %s", err)
		}
		got := ls.LoRA
		if got.Seen != want.Seen || got.MaxLoRA != want.MaxLoRA || got.At != want.At ||
			!slices.Equal(got.Running, want.Running) || !slices.Equal(got.Waiting, want.Waiting) {
			t.Fatalf("LoRA = %+v; want %+v", got, want)
		}
		if ls.Running != 12 || ls.Waiting != 3 {
			t.Fatalf("queue = %d, %d; the LoRA series changed the load", ls.Running, ls.Waiting)
		}
	}
	f("", LoRASample{})
	// The newest label set wins, wherever it sits in the body.
	f(vllmLoRASeries, LoRASample{Seen: true, MaxLoRA: 4, Running: []string{"chat-lora", "sql-lora"},
		Waiting: []string{"tool-lora"}, At: 1.79599131e+09})
	// An idle engine: empty lists.
	f(`vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.8e9`,
		LoRASample{Seen: true, MaxLoRA: 2, At: 1.8e9})
	// Empty names, duplicates and escapes; labels in any order, some missing.
	f(`vllm:lora_requests_info{waiting_lora_adapters=",,b,,a,b,",running_lora_adapters="x\"y,x\"y"} 5`,
		LoRASample{Seen: true, Running: []string{`x"y`}, Waiting: []string{"a", "b"}, At: 5})
	// NaN and Inf never win; garbage lines and a bad max_lora are skipped.
	f(`vllm:lora_requests_info{max_lora="4",running_lora_adapters="nan"} NaN
vllm:lora_requests_info{max_lora="4",running_lora_adapters="inf"} +Inf
vllm:lora_requests_info{max_lora="4",running_lora_adapters="garbage" 9e9
vllm:lora_requests_info{max_lora="-3",running_lora_adapters="ok"} 7
vllm:lora_requests_info{max_lora="four",running_lora_adapters="old"} 6`,
		LoRASample{Seen: true, Running: []string{"ok"}, At: 7})

	// Limits: a name over MaxAdapterNameLen bytes is dropped whole; a list keeps MaxLoRANames names.
	long := strings.Repeat("l", MaxAdapterNameLen+1)
	okName := strings.Repeat("k", MaxAdapterNameLen)
	f(`vllm:lora_requests_info{running_lora_adapters="`+long+`,`+okName+`"} 1`,
		LoRASample{Seen: true, Running: []string{okName}, At: 1})
	var many, want []string
	for i := range 3 * MaxLoRANames {
		many = append(many, fmt.Sprintf("a%04d", i))
	}
	want = slices.Clone(many[:MaxLoRANames])
	f(`vllm:lora_requests_info{running_lora_adapters="`+strings.Join(many, ",")+`"} 1`,
		LoRASample{Seen: true, Running: want, At: 1})
}

func TestParseEngineLoadLoRAOnly(t *testing.T) {
	// LoRA series alone are not engine load: the scrape still fails.
	if _, err := ParseEngineLoad([]byte(vllmLoRASeries), ""); err == nil {
		t.Fatalf("ParseEngineLoad of LoRA series alone = nil error; want no load series")
	}
}
