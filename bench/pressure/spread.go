package pressure

import (
	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/loadtest"
)

// LoadSpread is how requests spread over the engines.
type LoadSpread struct {
	Requests []int `json:"requests"`
	// Prefill is the prompt tokens each engine computed (prompt − cached).
	Prefill []int64 `json:"prefill_tokens"`
	// BusiestIdlest is max/min of Requests, BusiestIdlestPrefill of Prefill; -1 when an engine got none.
	BusiestIdlest        float64 `json:"busiest_idlest"`
	BusiestIdlestPrefill float64 `json:"busiest_idlest_prefill"`
	// Idle counts the engines with fewer than 5% of the mean requests.
	Idle int `json:"idle_engines"`
}

// loadSpread counts the answered samples' requests and prefill tokens per engine (names in fleet order).
func loadSpread(samples []loadtest.Sample, names []string) LoadSpread {
	idx := map[string]int{}
	for i, n := range names {
		idx[n] = i
	}
	s := LoadSpread{Requests: make([]int, len(names)), Prefill: make([]int64, len(names))}
	for i := range samples {
		sm := &samples[i]
		k, ok := idx[sm.Target]
		if !ok || sm.Error != "" {
			continue
		}
		s.Requests[k]++
		s.Prefill[k] += int64(sm.PromptTokens - sm.CachedTokens)
	}
	s.BusiestIdlest, _ = fleet.Spread(s.Requests)
	prefill := make([]int, len(s.Prefill))
	for i, v := range s.Prefill {
		prefill[i] = int(v)
	}
	s.BusiestIdlestPrefill, _ = fleet.Spread(prefill)
	total := 0
	for _, n := range s.Requests {
		total += n
	}
	mean := float64(total) / float64(max(len(names), 1))
	for _, n := range s.Requests {
		if float64(n) < 0.05*mean {
			s.Idle++
		}
	}
	return s
}

// burstSpread is the load spread over the burst of group hot: the samples (in send order) from its
// first request to its last; nil when none was sent.
func burstSpread(samples []loadtest.Sample, hot int, names []string) *LoadSpread {
	first, last := -1, -1
	for i := range samples {
		if samples[i].Group == hot {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 {
		return nil
	}
	b := loadSpread(samples[first:last+1], names)
	return &b
}
