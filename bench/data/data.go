// Package data holds the public traces of the reports, compiled into the report commands that replay them.
//
// mooncake-synthetic-trace.jsonl is the synthetic workload of the Mooncake FAST'25 trace release
// (kvcache-ai/Mooncake, FAST25-release/traces/synthetic_trace.jsonl, Apache-2.0): 3,993 requests built from
// public datasets, Poisson arrivals with multi-turn order kept. One JSON object a line: timestamp (ms),
// input_length and output_length (tokens), hash_ids (chained 512-token prefix blocks: two requests share their
// first k ids exactly when they share their first k blocks). Its infinite-cache prefix hit rate is 0.640 of
// the blocks. capture.Read reads the format.
package data

import _ "embed"

// Mooncake is the Mooncake synthetic trace, as released.
//
//go:embed mooncake-synthetic-trace.jsonl
var Mooncake []byte
