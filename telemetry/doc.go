// Package telemetry holds what Rolter knows about its targets from outside the request path, and the
// gateway's own metrics.
//
// Engine load: a Scraper polls an engine's Prometheus /metrics (vLLM names first, SGLang names as a
// fallback; docs/internals/engine-metrics.md) and stores running and waiting requests
// and KV-cache usage in an EngineLoad, which routing folds into Load(t) when `[metrics_scrape]` is on. The
// body is read with a zero-allocation Prometheus text parser (ParseLine, Scanner) in the style of
// VictoriaMetrics lib/protoparser/prometheus.
//
// LoRA adapters: an Adapters holds which adapters one engine has, from two sources. The Scraper (with
// ScrapeConfig.Adapters) reads vllm:lora_requests_info in the same pass as the load, the newest label set
// winning, into the running and waiting adapters and max_loras (LoadSample.LoRA); a ModelsPoller reads
// the engine's GET /v1/models, where vLLM lists each registered adapter as a card with a parent. Each
// store swaps in an immutable view, so the per-request reads (Running, Waiting, Registered, Lookup) are
// lock-free and allocation-free; View gives the sorted lists to the state API. Names and list sizes are
// capped: the engine is not trusted.
//
// LMCache: an LMCachePoller polls a status endpoint returning {"occupancy": 0..1, "cache_available":
// bool} into a CacheStatus for the `lmcache_aware` strategy.
//
// All pollers share one shape: one goroutine per target with Start and Stop, at most one request in
// flight, a timeout on every request, an optional Check hook called with the URL before every request
// (for an egress policy; the engine sets none yet), and a failed poll that invalidates the target's state
// at once. State readers (EngineLoad.Queue, CacheStatus.Get, the Adapters reads) take the caller's clock
// and a maximum age, so a failed or stale source contributes nothing rather than a stale number.
package telemetry
