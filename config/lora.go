package config

import (
	"strings"
)

// LoRAConfig is [routes.lora]: the route's targets serve LoRA adapters of its base model too. Each adapter
// is a model of its own to clients (its name is the public and the upstream model name, as vLLM serves it)
// and is routed within its home set: the replicas that hold it, then k replicas chosen by rendezvous hashing
// on its name, k growing with its load (docs/routing/lora.md).
type LoRAConfig struct {
	// Adapters are the adapters' names.
	Adapters []string `toml:"adapters" json:"adapters"`
	// HomeReplicas is the smallest home set (k), MaxHomeReplicas the largest (both capped by the number of
	// targets).
	HomeReplicas    *int `toml:"home_replicas" json:"home_replicas,omitempty"`
	MaxHomeReplicas *int `toml:"max_home_replicas" json:"max_home_replicas,omitempty"`
	// ReplicaRequests is how many of an adapter's requests in flight one home replica takes before the set
	// grows: k = ceil(in flight / ReplicaRequests), within the bounds above.
	ReplicaRequests *int `toml:"replica_requests" json:"replica_requests,omitempty"`
	// CoolSecs is how long an adapter's load must stay below its home set before the set shrinks by one
	// replica, and the time constant of the request rate its placement compares adapters by.
	CoolSecs *float64 `toml:"cool_secs" json:"cool_secs,omitempty"`
	// MaxLoRAs is the engines' adapter slots (vLLM's --max-loras) for an engine whose /metrics does not
	// report them (max_lora of vllm:lora_requests_info).
	MaxLoRAs *int `toml:"max_loras" json:"max_loras,omitempty"`
	// DynamicLoRA makes the gateway load an adapter on its chosen replica, through vLLM's
	// /v1/load_lora_adapter, when the replica does not list it in /v1/models; AdapterPath is the lora_path it
	// sends, "{adapter}" replaced by the adapter's name.
	DynamicLoRA bool   `toml:"dynamic_lora" json:"dynamic_lora"`
	AdapterPath string `toml:"adapter_path" json:"adapter_path,omitempty"`
	// LoadTimeoutSecs bounds one dynamic load.
	LoadTimeoutSecs *float64 `toml:"load_timeout_secs" json:"load_timeout_secs,omitempty"`
}

// Defaults of [routes.lora].
const (
	DefaultHomeReplicas    = 1
	DefaultMaxHomeReplicas = 4
	// DefaultReplicaRequests: an adapter's requests in flight one replica takes before a second one joins.
	DefaultReplicaRequests = 8
	DefaultLoRACoolSecs    = 30.0
	DefaultLoRALoadSecs    = 60.0
	// DefaultMaxLoRAs is vLLM's default --max-loras.
	DefaultMaxLoRAs = 1
	// MaxAdapters bounds the adapters of one route; MaxAdapterName their names' length in bytes.
	MaxAdapters = 1024
	// MaxAdapterSlots bounds max_loras: the gateway remembers 16 adapters per engine.
	MaxAdapterSlots = 16
	MaxAdapterName  = 256
	// AdapterPlaceholder is what AdapterPath's "{adapter}" is.
	AdapterPlaceholder = "{adapter}"
)

func (l *LoRAConfig) setDefaults() {
	setInt(&l.HomeReplicas, DefaultHomeReplicas)
	setInt(&l.MaxHomeReplicas, max(DefaultMaxHomeReplicas, *l.HomeReplicas))
	setInt(&l.ReplicaRequests, DefaultReplicaRequests)
	setFloat(&l.CoolSecs, DefaultLoRACoolSecs)
	setInt(&l.MaxLoRAs, DefaultMaxLoRAs)
	setFloat(&l.LoadTimeoutSecs, DefaultLoRALoadSecs)
}

func setInt(p **int, v int) {
	if *p == nil {
		*p = &v
	}
}

func setFloat(p **float64, v float64) {
	if *p == nil {
		*p = &v
	}
}

// PathOf returns the lora_path of adapter name.
func (l *LoRAConfig) PathOf(name string) string {
	return strings.ReplaceAll(l.AdapterPath, AdapterPlaceholder, name)
}

// ServedRoutes returns the routes the gateway serves: cfg's, each followed by one route per adapter of its
// [routes.lora] - the route's strategy, parameters, engines and [routes.lora], the adapter's name as the
// public and the upstream model - whose LoRABase names the route.
func (c *Config) ServedRoutes() []RouteConfig {
	out := make([]RouteConfig, 0, len(c.Routes))
	for _, rc := range c.Routes {
		out = append(out, rc)
		if rc.LoRA == nil {
			continue
		}
		for _, name := range rc.LoRA.Adapters {
			a := rc
			a.Model, a.LoRABase = name, rc.Model
			a.Shadow = nil
			a.Targets = make([]TargetConfig, len(rc.Targets))
			for j, t := range rc.Targets {
				t.Model = name
				a.Targets[j] = t
			}
			out = append(out, a)
		}
	}
	return out
}
