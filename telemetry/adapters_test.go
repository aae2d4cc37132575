package telemetry

import (
	"slices"
	"testing"
)

func TestAdaptersBatch(t *testing.T) {
	var a Adapters
	const maxAge = 100
	check := func(now int64, running, waiting []string, maxLoRA int, known bool) {
		t.Helper()
		for _, n := range []string{"sql-lora", "chat-lora", "tool-lora", "other", ""} {
			if got, want := a.Running(n, now, maxAge), slices.Contains(running, n); got != want {
				t.Fatalf("Running(%q, %d) = %v; want %v", n, now, got, want)
			}
			if got, want := a.Waiting(n, now, maxAge), slices.Contains(waiting, n); got != want {
				t.Fatalf("Waiting(%q, %d) = %v; want %v", n, now, got, want)
			}
			if st := a.Lookup([]byte(n), now, maxAge); st.Running != slices.Contains(running, n) || st.Waiting != slices.Contains(waiting, n) || st.Registered {
				t.Fatalf("Lookup(%q, %d) = %+v", n, now, st)
			}
		}
		if got := a.RunningCount(now, maxAge); got != len(running) {
			t.Fatalf("RunningCount(%d) = %d; want %d", now, got, len(running))
		}
		if m, ok := a.MaxLoRA(now, maxAge); m != maxLoRA || ok != (maxLoRA > 0) {
			t.Fatalf("MaxLoRA(%d) = %d, %v; want %d", now, m, ok, maxLoRA)
		}
		v := a.View(now, maxAge)
		if v.BatchKnown != known || !slices.Equal(v.Running, running) || !slices.Equal(v.Waiting, waiting) || v.MaxLoRA != maxLoRA {
			t.Fatalf("View(%d) = %+v; want running %q waiting %q max %d known %v", now, v, running, waiting, maxLoRA, known)
		}
	}
	check(0, nil, nil, 0, false) // the zero Adapters knows nothing

	a.StoreBatch(LoRASample{Seen: true, MaxLoRA: 4, Running: []string{"chat-lora", "sql-lora"}, Waiting: []string{"tool-lora"}}, 1000)
	check(1000, []string{"chat-lora", "sql-lora"}, []string{"tool-lora"}, 4, true)
	check(1099, []string{"chat-lora", "sql-lora"}, []string{"tool-lora"}, 4, true)
	check(1100, nil, nil, 0, false) // stale
	if !a.Running("sql-lora", 5000, 0) {
		t.Fatalf("maxAge 0 must disable the age check")
	}

	a.InvalidateBatch() // a failed scrape
	check(1000, nil, nil, 0, false)

	a.StoreBatch(LoRASample{Seen: true, MaxLoRA: 2}, 2000) // an idle engine
	check(2000, nil, nil, 2, true)
	a.StoreBatch(LoRASample{}, 3000) // a scrape without the series
	check(3000, nil, nil, 0, false)
}

func TestAdaptersModels(t *testing.T) {
	var a Adapters
	const maxAge = 100
	check := func(now int64, registered []string, known bool) {
		t.Helper()
		for _, n := range []string{"Qwen/Qwen3-0.6B", "sql-lora", "chat-lora", "other"} {
			if got, want := a.Registered(n, now, maxAge), slices.Contains(registered, n); got != want {
				t.Fatalf("Registered(%q, %d) = %v; want %v", n, now, got, want)
			}
			if st := a.Lookup([]byte(n), now, maxAge); st.Registered != slices.Contains(registered, n) || st.Running || st.Waiting {
				t.Fatalf("Lookup(%q, %d) = %+v", n, now, st)
			}
		}
		v := a.View(now, maxAge)
		if v.ModelsKnown != known || !slices.Equal(v.Registered, registered) {
			t.Fatalf("View(%d) = %+v; want registered %q known %v", now, v, registered, known)
		}
		if v.BatchKnown {
			t.Fatalf("View(%d).BatchKnown without a batch", now)
		}
	}
	check(0, nil, false)
	a.StoreModels(ModelList{
		Base: []string{"Qwen/Qwen3-0.6B"},
		Adapters: []AdapterCard{
			{Name: "sql-lora", Parent: "Qwen/Qwen3-0.6B", Root: "/adapters/sql"},
			{Name: "chat-lora", Parent: "Qwen/Qwen3-0.6B"},
		},
	}, 1000)
	check(1050, []string{"chat-lora", "sql-lora"}, true) // a base model is not a registered adapter
	check(1100, nil, false)
	a.InvalidateModels()
	check(1000, nil, false)
	a.StoreModels(ModelList{Base: []string{"Qwen/Qwen3-0.6B"}}, 2000) // no adapters: known and empty
	check(2000, nil, true)
}
