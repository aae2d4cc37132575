package config

import (
	"fmt"
	"math"
	"strings"
)

// lora checks [routes.lora] of route r (at key): its adapters' names and its parameters.
func (v *validator) lora(key string, r *RouteConfig) {
	l := r.LoRA
	lk := key + ".lora"
	if r.Org != "" {
		v.addf(lk, "an org's route cannot serve LoRA adapters")
	}
	if r.Disaggregation != nil {
		v.addf(lk, "a disaggregated route cannot serve LoRA adapters")
	}
	if len(l.Adapters) == 0 {
		v.addf(lk+".adapters", "route %q names no adapters", r.Model)
	}
	if len(l.Adapters) > MaxAdapters {
		v.addf(lk+".adapters", "route %q names %d adapters; at most %d are supported", r.Model, len(l.Adapters), MaxAdapters)
	}
	seen := make(map[string]int, len(l.Adapters))
	for j, name := range l.Adapters {
		ak := fmt.Sprintf("%s.adapters[%d]", lk, j)
		switch {
		case name == "":
			v.addf(ak, "empty adapter name")
		case len(name) > MaxAdapterName:
			v.addf(ak, "adapter name is %d bytes; at most %d", len(name), MaxAdapterName)
		case strings.ContainsFunc(name, func(c rune) bool { return c <= ' ' || c == 0x7f || c == ',' || c == '"' || c == '\\' }):
			// vLLM's lora_requests_info joins running adapters with commas: a name with one cannot be read back.
			v.addf(ak, "adapter name %q has a space, control character, comma, quote or backslash", name)
		case name == r.Model:
			v.addf(ak, "adapter %q is the route's own model", name)
		}
		if k, dup := seen[name]; dup {
			v.addf(ak, "adapter %q is listed twice (also adapters[%d])", name, k)
		}
		seen[name] = j
	}
	lo, hi := *l.HomeReplicas, *l.MaxHomeReplicas
	if lo < 1 {
		v.addf(lk+".home_replicas", "home_replicas must be >= 1, got %d", lo)
	}
	if hi < lo {
		v.addf(lk+".max_home_replicas", "max_home_replicas (%d) must be >= home_replicas (%d)", hi, lo)
	}
	if hi > MaxTargets {
		v.addf(lk+".max_home_replicas", "max_home_replicas must be <= %d, got %d", MaxTargets, hi)
	}
	if n := *l.ReplicaRequests; n < 1 {
		v.addf(lk+".replica_requests", "replica_requests must be >= 1, got %d", n)
	}
	if n := *l.MaxLoRAs; n < 1 || n > MaxAdapterSlots {
		v.addf(lk+".max_loras", "max_loras must be in 1..%d, got %d", MaxAdapterSlots, n)
	}
	if s := *l.CoolSecs; !(s > 0) || math.IsInf(s, 0) {
		v.addf(lk+".cool_secs", "cool_secs must be > 0, got %v", s)
	}
	if s := *l.LoadTimeoutSecs; !(s > 0) || math.IsInf(s, 0) {
		v.addf(lk+".load_timeout_secs", "load_timeout_secs must be > 0, got %v", s)
	}
	switch {
	case l.DynamicLoRA && !strings.Contains(l.AdapterPath, AdapterPlaceholder):
		v.addf(lk+".adapter_path", "dynamic_lora needs adapter_path with %q, the lora_path sent to vLLM for each adapter", AdapterPlaceholder)
	case !l.DynamicLoRA && l.AdapterPath != "":
		v.addf(lk+".adapter_path", "adapter_path is used by dynamic_lora only")
	case strings.ContainsFunc(l.AdapterPath, func(c rune) bool { return c < ' ' || c == 0x7f }):
		v.addf(lk+".adapter_path", "adapter_path has a control character")
	}
}

// loraNames checks that no adapter of a route is another route's model or another route's adapter: each is a
// model of its own to clients. models maps each route's model to its index.
func (v *validator) loraNames(rs []RouteConfig, models map[string]int) {
	owner := map[string]int{}
	for i := range rs {
		if rs[i].LoRA == nil {
			continue
		}
		for j, name := range rs[i].LoRA.Adapters {
			ak := fmt.Sprintf("routes[%d].lora.adapters[%d]", i, j)
			if k, ok := models[name]; ok && k != i {
				v.addf(ak, "adapter %q is the model of routes[%d]", name, k)
			} else if k, ok := owner[name]; ok && k != i {
				v.addf(ak, "adapter %q is also an adapter of routes[%d]", name, k)
			}
			owner[name] = i
		}
	}
}
