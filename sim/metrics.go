package sim

import (
	"strconv"
	"strings"
	"time"
)

// appendMetrics appends the /metrics body in the shape prometheus_client gives vLLM
// (docs/internals/engine-metrics.md; test vector TV9): # HELP and # TYPE per
// family, counters named *_total in all three lines plus a *_created family, labels sorted
// (engine, model_name), floats printed the Python way.
func (e *Engine) appendMetrics(dst []byte) []byte {
	e.mu.Lock()
	running, waiting := e.running, e.waiting
	used := e.cache.usedBlocks()
	queried, hits := e.queried, e.hits
	extQueried, extHits, expired := e.extQueried, e.extHits, e.expiredReqs
	xfer := e.xfer
	var loraInfo []loraInfo
	var loraLoads, loraEvictions uint64
	if e.cfg.EnableLoRA {
		loraInfo = e.lora.requestsInfo(float64(time.Now().UnixNano()) / 1e9)
		loraLoads, loraEvictions = e.lora.loads, e.lora.evictions
	}
	e.mu.Unlock()

	labels := `{engine="` + escapeLabel(e.cfg.EngineLabel) + `",model_name="` + escapeLabel(e.cfg.Model) + `"}`
	gauge := func(name, help string, v float64) {
		dst = append(dst, "# HELP "+name+" "+help+"\n# TYPE "+name+" gauge\n"+name+labels+" "...)
		dst = appendPyFloat(dst, v)
		dst = append(dst, '\n')
	}
	counter := func(name, help string, v uint64) {
		dst = append(dst, "# HELP "+name+"_total "+help+"\n# TYPE "+name+"_total counter\n"+name+"_total"+labels+" "...)
		dst = appendPyFloat(dst, float64(v))
		dst = append(dst, "\n# HELP "+name+"_created "+help+"\n# TYPE "+name+"_created gauge\n"+name+"_created"+labels+" "...)
		dst = appendPyFloat(dst, e.createdAt)
		dst = append(dst, '\n')
	}
	gauge("vllm:num_requests_running", "Number of requests in model execution batches.", float64(running))
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", float64(waiting))
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", float64(used)/float64(e.cfg.NumBlocks))
	counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", queried)
	counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", hits)
	if e.cfg.EnableLoRA {
		dst = appendLoRAInfo(dst, e.cfg.MaxLoRAs, loraInfo)
		counter("rolter_sim_lora_loads", "LoRA adapters loaded into a GPU slot (sim).", loraLoads)
		counter("rolter_sim_lora_evictions", "LoRA adapters evicted from a GPU slot to load another (sim).", loraEvictions)
	}
	if e.cfg.Role != RoleAggregated {
		// What vLLM exposes with a KV connector (v1/metrics/loggers.py, nixl/stats.py).
		counter("vllm:external_prefix_cache_queries", "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.", extQueried)
		counter("vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.", extHits)
		counter("vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers.", e.pullsFailed.Load())
		counter("vllm:nixl_num_failed_notifications", "Number of failed NIXL KV Cache notifications.", e.failedNotifs.Load())
		counter("vllm:nixl_num_kv_expired_reqs", "Number of requests that had their KV expire. NOTE: This metric is tracked on the P instance.", expired)
		// SGLang's protocol: its scheduler's failure counters (metrics/collector.py), and the sim's own.
		counter("sglang:num_bootstrap_failed_reqs", "The number of bootstrap failed requests.", e.roomsExpired.Load())
		counter("sglang:num_transfer_failed_reqs", "The number of transfer failed requests.", e.roomsFailed.Load())
		counter("rolter_sim_bootstrap_rooms_served", "Rooms whose blocks a decode engine read (sim).", e.roomsServed.Load())
		counter("rolter_sim_bootstrap_rooms_aborted", "Rooms freed because one side's request was aborted (sim).", e.roomsAborted.Load())
		dst = xfer.append(dst, "vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV Cache transfers.", e.cfg.EngineLabel, e.cfg.Model, e.createdAt)
	}
	// prometheus_client's process collector: a restarted engine has a new start time.
	dst = append(dst, "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds "...)
	dst = appendPyFloat(dst, e.startTime())
	dst = append(dst, '\n')
	dst = append(dst, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n"...)
	dst = append(dst, `vllm:cache_config_info{block_size="`...)
	dst = strconv.AppendInt(dst, int64(e.cfg.BlockSize), 10)
	dst = append(dst, `",enable_prefix_caching="True",engine="`+escapeLabel(e.cfg.EngineLabel)+`",num_gpu_blocks="`...)
	dst = strconv.AppendInt(dst, int64(e.cfg.NumBlocks), 10)
	dst = append(dst, `",prefix_caching_hash_algo="sha256_cbor"} 1.0`+"\n"...)
	return dst
}

// appendLoRAInfo appends vLLM's vllm:lora_requests_info (v1/metrics/loggers.py): a gauge whose
// labels name the running and waiting adapters and whose value is when it was set, one series
// per label set it has had (the reader takes the largest value). It has no engine or
// model_name label.
func appendLoRAInfo(dst []byte, maxLoRAs int, info []loraInfo) []byte {
	const name = "vllm:lora_requests_info"
	dst = append(dst, "# HELP "+name+" Running stats on lora requests.\n# TYPE "+name+" gauge\n"...)
	for _, in := range info {
		dst = append(dst, name+`{max_lora="`...)
		dst = strconv.AppendInt(dst, int64(maxLoRAs), 10)
		dst = append(dst, `",`...)
		dst = append(dst, in.labels...)
		dst = append(dst, "} "...)
		dst = appendPyFloat(dst, in.at)
		dst = append(dst, '\n')
	}
	return dst
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func escapeLabel(s string) string { return labelEscaper.Replace(s) }

// appendPyFloat appends f as prometheus_client's floatToGoString does: Python's repr, switched
// to Go's exponent form for values with more than 6 integer digits
// (1234567.0 -> "1.234567e+06", 1795989349.134967 -> "1.795989349134967e+09").
func appendPyFloat(dst []byte, f float64) []byte {
	start := len(dst)
	exp := 0
	if f != 0 {
		var buf [32]byte
		s := strconv.AppendFloat(buf[:0], f, 'e', -1, 64)
		i := len(s) - 1
		for s[i] != 'e' {
			i--
		}
		exp, _ = strconv.Atoi(string(s[i+1:]))
	}
	if exp < -4 || exp >= 16 {
		// Python repr uses exponents outside [1e-4, 1e16); the forms agree ("1e-05", "1e+16").
		return strconv.AppendFloat(dst, f, 'e', -1, 64)
	}
	dst = strconv.AppendFloat(dst, f, 'f', -1, 64)
	s := dst[start:]
	dot := -1
	for i, c := range s {
		if c == '.' {
			dot = i
			break
		}
	}
	if dot < 0 {
		dot = len(s)
		dst = append(dst, ".0"...)
		s = dst[start:]
	}
	if f > 0 && dot > 6 {
		// mantissa = s[0] "." s[1:dot] s[dot+1:], then rstrip("0.") and "e+0<dot-1>".
		var m [40]byte
		mb := append(m[:0], s[0], '.')
		mb = append(mb, s[1:dot]...)
		mb = append(mb, s[dot+1:]...)
		for len(mb) > 0 && (mb[len(mb)-1] == '0' || mb[len(mb)-1] == '.') {
			mb = mb[:len(mb)-1]
		}
		dst = append(dst[:start], mb...)
		dst = append(dst, "e+0"...)
		dst = strconv.AppendInt(dst, int64(dot-1), 10)
	}
	return dst
}

// xferBuckets are the upper bounds of vllm:nixl_xfer_time_seconds (nixl/stats.py).
var xferBuckets = [...]float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0}

// histogram is a prometheus_client histogram of seconds over xferBuckets. The zero value is empty.
type histogram struct {
	counts [len(xferBuckets)]uint64 // observations <= each bound (not cumulative)
	count  uint64
	sum    float64
}

func (h *histogram) observe(seconds float64) {
	h.count++
	h.sum += seconds
	for i, le := range xferBuckets {
		if seconds <= le {
			h.counts[i]++
			return
		}
	}
}

// append writes the family as prometheus_client does: cumulative _bucket lines with le between
// the sorted labels, +Inf, _count, _sum, then the _created gauge.
func (h *histogram) append(dst []byte, name, help, engine, model string, created float64) []byte {
	eng, mod := `engine="`+escapeLabel(engine)+`"`, `model_name="`+escapeLabel(model)+`"`
	dst = append(dst, "# HELP "+name+" "+help+"\n# TYPE "+name+" histogram\n"...)
	var cum uint64
	bucket := func(le string, n uint64) {
		dst = append(dst, name+"_bucket{"+eng+`,le="`+le+`",`+mod+"} "...)
		dst = appendPyFloat(dst, float64(n))
		dst = append(dst, '\n')
	}
	for i, le := range xferBuckets {
		cum += h.counts[i]
		bucket(string(appendPyFloat(nil, le)), cum)
	}
	bucket("+Inf", h.count)
	labels := "{" + eng + "," + mod + "} "
	dst = append(dst, name+"_count"+labels...)
	dst = appendPyFloat(dst, float64(h.count))
	dst = append(dst, "\n"+name+"_sum"+labels...)
	dst = appendPyFloat(dst, h.sum)
	dst = append(dst, "\n# HELP "+name+"_created "+help+"\n# TYPE "+name+"_created gauge\n"+name+"_created"+labels...)
	dst = appendPyFloat(dst, created)
	return append(dst, '\n')
}

// observeTransfer records one successful pull.
func (e *Engine) observeTransfer(d time.Duration) {
	e.mu.Lock()
	e.xfer.observe(d.Seconds())
	e.mu.Unlock()
}
