package telemetry

import (
	"fmt"
	"testing"
)

func BenchmarkAdaptersLookup(b *testing.B) {
	var a Adapters
	var names []string
	var cards []AdapterCard
	for i := range 64 {
		n := fmt.Sprintf("tenant-%02d-adapter-for-customer-support", i)
		names = append(names, n)
		cards = append(cards, AdapterCard{Name: n, Parent: "Qwen/Qwen3-0.6B"})
	}
	a.StoreBatch(LoRASample{Seen: true, MaxLoRA: 8, Running: names[:8], Waiting: names[8:12]}, 1)
	a.StoreModels(ModelList{Adapters: cards}, 1)
	name := []byte(names[5])
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var sum uint64
		for pb.Next() {
			if st := a.Lookup(name, 2, 1000); st.Running && st.Registered {
				sum++
			}
			sum += uint64(a.RunningCount(2, 1000))
		}
		Sink.Add(sum)
	})
}
