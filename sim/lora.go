package sim

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"
)

// LoRA adapters, as vLLM serves them (vllm/entrypoints/openai/serving_models.py, the v1
// scheduler and LRUCacheWorkerLoRAManager):
//   - the registry holds the adapters requests may name: --lora-modules, plus those added by
//     POST /v1/load_lora_adapter when runtime updating is on;
//   - at most MaxLoRAs adapters sit in GPU slots. A request naming an adapter outside the
//     slots takes a free slot, or evicts the least recently used adapter no running request
//     uses; the load takes LoRALoadDelay before its prefill, shared by every request of that
//     adapter admitted meanwhile. When every slot's adapter is in use the request waits, as
//     vLLM's scheduler skips requests whose adapter would exceed max_loras;
//   - so that a waiting adapter is not starved by a busy one, the first request held back
//     marks the least recently used slot as draining: no new request of that adapter starts
//     until it is evicted (vLLM has no such rule; without it a steady stream of one adapter
//     would keep another out for ever).
// Everything here is under Engine.mu.

// loraAdapter is one registered adapter. It outlives its registration while requests that
// named it still wait or run.
type loraAdapter struct {
	name     string
	path     string
	id       int    // vLLM's lora_int_id: 1, 2, … in registration order
	nameJSON []byte // the name as a JSON string, for the answers' "model"

	slotted  bool      // in a GPU slot
	readyAt  time.Time // when the slot's load is over
	lastUsed uint64    // loraState.clock at its last admission, for LRU eviction
	running  int       // running requests using it
	waiting  int       // waiting requests naming it
	removed  bool      // unloaded: out of the registry, out of its slot once idle
}

// loraState is the engine's adapter registry and GPU slots. Under Engine.mu.
type loraState struct {
	byName  map[string]*loraAdapter
	list    []*loraAdapter // the registry in registration order (the /v1/models order)
	nextID  int
	slots   []*loraAdapter // at most MaxLoRAs
	clock   uint64
	drain   *loraAdapter // the slot a held-back request waits for; nil when none waits
	blocked int          // waiting requests held back only by their adapter

	loads      uint64 // adapters loaded into a GPU slot
	evictions  uint64 // adapters evicted from a slot to make room
	apiLoads   uint64 // successful /v1/load_lora_adapter calls
	apiUnloads uint64 // successful /v1/unload_lora_adapter calls

	info []loraInfo // label sets of vllm:lora_requests_info, at most loraInfoKeep
}

// loraInfoKeep is how many label sets of vllm:lora_requests_info stay exposed. prometheus_client
// keeps every label set a gauge was ever given; the sim keeps the latest few.
const loraInfoKeep = 16

// loraInfo is one series of vllm:lora_requests_info: its labels after max_lora and the time
// it was last set.
type loraInfo struct {
	labels string
	at     float64
}

func (s *loraState) init(cfg *Config) {
	s.byName = make(map[string]*loraAdapter)
	for _, m := range cfg.LoRAModules {
		s.register(m.Name, m.Path)
	}
}

// register adds an adapter to the registry; the caller checked the name is free.
func (s *loraState) register(name, path string) *loraAdapter {
	s.nextID++
	a := &loraAdapter{name: name, path: path, id: s.nextID, nameJSON: appendJSONString(nil, name)}
	s.byName[name] = a
	s.list = append(s.list, a)
	return a
}

// unregister removes a from the registry, and from its slot when no request runs with it.
func (s *loraState) unregister(a *loraAdapter) {
	delete(s.byName, a.name)
	for i, x := range s.list {
		if x == a {
			s.list = append(s.list[:i], s.list[i+1:]...)
			break
		}
	}
	a.removed = true
	if a.running == 0 {
		s.unslot(a)
	}
}

// unslot takes a out of its GPU slot, if it has one.
func (s *loraState) unslot(a *loraAdapter) {
	if !a.slotted {
		return
	}
	for i, x := range s.slots {
		if x == a {
			s.slots = append(s.slots[:i], s.slots[i+1:]...)
			break
		}
	}
	a.slotted = false
	if s.drain == a {
		s.drain = nil
	}
}

// canRun reports whether a request of adapter a can start now: a is in a slot that is not
// draining, a slot is free, or a slot's adapter is idle. When it cannot, the least recently
// used slot starts draining, unless one already does.
func (s *loraState) canRun(a *loraAdapter, maxLoRAs int) bool {
	if a.slotted {
		return s.drain != a
	}
	if len(s.slots) < maxLoRAs || s.idleVictim() != nil {
		return true
	}
	if s.drain == nil {
		s.drain = s.slots[0]
		for _, x := range s.slots[1:] {
			if x.lastUsed < s.drain.lastUsed {
				s.drain = x
			}
		}
	}
	return false
}

// idleVictim returns the least recently used slotted adapter no request runs with, or nil.
func (s *loraState) idleVictim() *loraAdapter {
	var v *loraAdapter
	for _, x := range s.slots {
		if x.running == 0 && (v == nil || x.lastUsed < v.lastUsed) {
			v = x
		}
	}
	return v
}

// start counts a request of a as running, loading a into a slot first when it has none
// (canRun said it may). It returns how long the request waits for the load to finish.
func (s *loraState) start(a *loraAdapter, cfg *Config, now time.Time) time.Duration {
	if !a.slotted {
		if len(s.slots) >= cfg.MaxLoRAs {
			v := s.idleVictim()
			if v == nil {
				panic("BUG: sim loads a LoRA adapter without a free slot")
			}
			s.unslot(v)
			s.evictions++
		}
		s.slots = append(s.slots, a)
		a.slotted = true
		a.readyAt = now.Add(cfg.LoRALoadDelay)
		s.loads++
		s.drain = nil // a held-back request got its slot; the next one picks a slot anew
	}
	s.clock++
	a.lastUsed = s.clock
	a.running++
	return max(a.readyAt.Sub(now), 0)
}

// stop counts one request of a as no longer running.
func (s *loraState) stop(a *loraAdapter) {
	a.running--
	if a.running == 0 && a.removed {
		s.unslot(a)
	}
}

// blockedChanged records that a waiting request is held back by its adapter (on) or no longer
// is; with none held back no slot drains.
func (s *loraState) blockedChanged(on bool) {
	if on {
		s.blocked++
		return
	}
	s.blocked--
	if s.blocked == 0 {
		s.drain = nil
	}
}

// lookupLoRA returns the registered adapter named name, or nil.
func (e *Engine) lookupLoRA(name []byte) *loraAdapter {
	e.mu.Lock()
	a := e.lora.byName[string(name)]
	e.mu.Unlock()
	return a
}

// requestsInfo returns the series of vllm:lora_requests_info, after setting the one of the
// current running and waiting adapters to now, as vLLM's logger does every step. Adapters are
// listed in registration order.
func (s *loraState) requestsInfo(now float64) []loraInfo {
	var running, waiting []string
	seen := func(a *loraAdapter) {
		if a.running > 0 {
			running = append(running, a.name)
		}
		if a.waiting > 0 {
			waiting = append(waiting, a.name)
		}
	}
	for _, a := range s.list {
		seen(a)
	}
	for _, a := range s.slots {
		if a.removed {
			seen(a)
		}
	}
	labels := `waiting_lora_adapters="` + escapeLabel(strings.Join(waiting, ",")) +
		`",running_lora_adapters="` + escapeLabel(strings.Join(running, ",")) + `"`
	for i := range s.info {
		if s.info[i].labels == labels {
			s.info[i].at = now
			return append([]loraInfo(nil), s.info...)
		}
	}
	if len(s.info) == loraInfoKeep {
		oldest := 0
		for i := range s.info {
			if s.info[i].at < s.info[oldest].at {
				oldest = i
			}
		}
		s.info = append(s.info[:oldest], s.info[oldest+1:]...)
	}
	s.info = append(s.info, loraInfo{labels: labels, at: now})
	return append([]loraInfo(nil), s.info...)
}

// loraModulesFlag is --lora-modules: name=path entries separated by commas or spaces, or one
// JSON object {"name", "path"} (vLLM's LoRAParserAction); the flag may repeat.
type loraModulesFlag struct {
	modules []LoRAModule
}

func (f *loraModulesFlag) String() string {
	if f == nil {
		return ""
	}
	parts := make([]string, len(f.modules))
	for i, m := range f.modules {
		parts[i] = m.Name + "=" + m.Path
	}
	return strings.Join(parts, ",")
}

func (f *loraModulesFlag) Set(v string) error {
	if s := strings.TrimSpace(v); strings.HasPrefix(s, "{") {
		var m struct {
			Name string `json:"name"`
			Path string `json:"path"`
		}
		if err := json.Unmarshal([]byte(s), &m); err != nil || m.Name == "" || m.Path == "" {
			return fmt.Errorf("cannot parse lora module %q: want {\"name\": ..., \"path\": ...}", v)
		}
		f.modules = append(f.modules, LoRAModule{Name: m.Name, Path: m.Path})
		return nil
	}
	for _, entry := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' }) {
		name, path, ok := strings.Cut(entry, "=")
		if !ok || name == "" || path == "" {
			return fmt.Errorf("cannot parse lora module %q: want name=path", entry)
		}
		f.modules = append(f.modules, LoRAModule{Name: name, Path: path})
	}
	return nil
}

// runtimeLoRAFromEnv reads VLLM_ALLOW_RUNTIME_LORA_UPDATING as vLLM's envs.py does: "1" or
// "true", any case.
func runtimeLoRAFromEnv() bool {
	v := strings.ToLower(strings.TrimSpace(os.Getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING")))
	return v == "1" || v == "true"
}

// validateLoRA returns every problem of the LoRA settings.
func (c *Config) validateLoRA() []error {
	var errs []error
	if c.MaxLoRAs < 0 || c.MaxCPULoRAs < 0 {
		errs = append(errs, fmt.Errorf("max loras %d and max cpu loras %d must be positive", c.MaxLoRAs, c.MaxCPULoRAs))
	}
	if c.MaxCPULoRAs > 0 && c.MaxCPULoRAs < c.MaxLoRAs {
		errs = append(errs, fmt.Errorf("max cpu loras %d must be at least max loras %d", c.MaxCPULoRAs, c.MaxLoRAs))
	}
	if c.LoRALoadDelay < 0 {
		errs = append(errs, fmt.Errorf("lora load delay %s must not be negative", c.LoRALoadDelay))
	}
	if !c.EnableLoRA && (len(c.LoRAModules) > 0 || c.AllowRuntimeLoRA) {
		errs = append(errs, fmt.Errorf("lora modules and runtime lora updating need enable-lora"))
	}
	seen := make(map[string]bool, len(c.LoRAModules))
	for _, m := range c.LoRAModules {
		switch {
		case m.Name == "" || m.Path == "":
			errs = append(errs, fmt.Errorf("lora module %q needs a name and a path", m.Name+"="+m.Path))
		case m.Name == c.Model:
			errs = append(errs, fmt.Errorf("lora module %q has the base model's name", m.Name))
		case seen[m.Name]:
			errs = append(errs, fmt.Errorf("lora module %q given twice", m.Name))
		}
		seen[m.Name] = true
	}
	return errs
}
