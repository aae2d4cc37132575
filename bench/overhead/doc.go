// Package overhead is the gateway-overhead report (bench/cmd/overhead, `make bench-overhead`): the latency,
// throughput, CPU and memory a request pays through Rolter against the direct path, HAProxy and null proxies
// (bench/cmd/refproxy), on a small-body case and a cache_aware case with 8 KiB prompts. Measure is one
// closed loop through one build, what the A/B comparison (bench/ab) runs.
package overhead
