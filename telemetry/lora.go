package telemetry

import (
	"bytes"
	"math"
	"slices"
	"strconv"
)

// loraInfoName is the gauge vLLM sets when LoRA is enabled (vllm/v1/metrics/loggers.py, gauge_lora_info):
// labels max_lora, waiting_lora_adapters and running_lora_adapters (adapter names joined with ","), and
// the unix time, in seconds, when the labels were set as its value. prometheus_client keeps every label
// set it has seen, so older combinations stay exposed with older times: the current one is the series
// with the largest value.
const loraInfoName = "vllm:lora_requests_info"

// Limits on what one engine may claim: the engine is not trusted, and a name list is parsed on every
// scrape.
const (
	// MaxLoRANames caps the adapter names kept per list (running, waiting); the rest are dropped.
	MaxLoRANames = 256
	// MaxAdapterNameLen caps an adapter name in bytes; a longer name is dropped, not truncated, so it
	// cannot match another adapter.
	MaxAdapterNameLen = 256
)

// LoRASample is the newest vllm:lora_requests_info series of one /metrics body.
type LoRASample struct {
	// Seen is false when the body has no usable series (LoRA disabled, or an engine that does not
	// expose it); the other fields are then zero.
	Seen bool
	// MaxLoRA is the engine's max_loras: how many adapters one batch may hold. 0 when the label is
	// missing or not a positive integer.
	MaxLoRA int
	// Running and Waiting are the adapter names of running and waiting requests, sorted, without
	// duplicates or empty names, at most MaxLoRANames each.
	Running, Waiting []string
	// At is the series value: the engine's unix time, in seconds, when it set these labels.
	At float64
}

// loraSeries keeps the newest lora_requests_info series during a scan. labels aliases the scanned
// body, so nothing is copied, and nothing allocated, until sample.
type loraSeries struct {
	labels []byte
	at     float64
	seen   bool
}

func (l *loraSeries) offer(s *Sample) {
	if math.IsNaN(s.Value) || math.IsInf(s.Value, 0) {
		return
	}
	if l.seen && s.Value <= l.at {
		return
	}
	l.labels, l.at, l.seen = s.Labels, s.Value, true
}

// sample decodes the kept series. It must be called while the scanned body is still unmodified.
func (l *loraSeries) sample() LoRASample {
	if !l.seen {
		return LoRASample{}
	}
	s := Sample{Labels: l.labels}
	ls := LoRASample{Seen: true, At: l.at}
	if v, ok := s.Label("max_lora"); ok {
		if n, err := strconv.Atoi(string(v)); err == nil && n > 0 {
			ls.MaxLoRA = n
		}
	}
	if v, ok := s.Label("running_lora_adapters"); ok {
		ls.Running = splitAdapterNames(v)
	}
	if v, ok := s.Label("waiting_lora_adapters"); ok {
		ls.Waiting = splitAdapterNames(v)
	}
	return ls
}

// splitAdapterNames splits a comma-joined name list into its first MaxLoRANames distinct names, sorted,
// dropping empty and over-long names; nil when none is left. Each name is a copy of its own, so a huge
// label does not stay in memory behind a few short names.
func splitAdapterNames(v []byte) []string {
	var names []string
	seen := make(map[string]struct{})
	for len(v) > 0 && len(names) < MaxLoRANames {
		part := v
		if i := bytes.IndexByte(v, ','); i >= 0 {
			part, v = v[:i], v[i+1:]
		} else {
			v = nil
		}
		if len(part) == 0 || len(part) > MaxAdapterNameLen {
			continue
		}
		if _, dup := seen[string(part)]; dup {
			continue
		}
		name := string(part)
		seen[name] = struct{}{}
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
