package telemetry

// The series of LoRA adapters ([routes.lora]): an adapter route's home set and loads, and what each engine
// reports of its adapters. Registered through Set.Gauge and Set.CounterFunc; the route label is the
// adapter's route (its name), so there is one series per adapter, bounded by the config.
const (
	LoRAHomeReplicas = "rolter_lora_home_replicas"      // {route} gauge: the adapter's home set width (k)
	LoRAHolders      = "rolter_lora_holders"            // {route} gauge: replicas that hold the adapter now
	LoRAInflight     = "rolter_lora_requests_in_flight" // {route} gauge: the adapter's requests in flight
	LoRALoads        = "rolter_lora_loads_total"        // {route,result} counter: dynamic loads, ok | failed
	EngineLoRA       = "rolter_engine_lora_adapters"    // {target,state} gauge: running | waiting | registered
	EngineLoRASlots  = "rolter_engine_lora_slots"       // {target} gauge: the engine's max_lora
)
