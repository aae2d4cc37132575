#!/usr/bin/python3
# Regenerates vllm_metrics.txt and sglang_metrics.txt with python prometheus_client
# (Debian python3-prometheus-client 0.16), the library vLLM and SGLang expose /metrics with.
# Metric names, types, labels and buckets follow vllm/v1/metrics/loggers.py and the SGLang
# production-metrics page (see /work/shared/research/vllm-wire.md section 5). Values are fixed;
# only the *_created samples carry wall-clock time, as on a real engine.
#
#   /usr/bin/python3 testdata/gen_fixtures.py  (from the telemetry folder)
import os
from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                               GCCollector, PlatformCollector, ProcessCollector,
                               generate_latest)

here = os.path.dirname(os.path.abspath(__file__))


def std(reg):
    GCCollector(registry=reg)
    PlatformCollector(registry=reg)
    ProcessCollector(registry=reg)


def vllm():
    reg = CollectorRegistry()
    std(reg)
    model = "Qwen/Qwen3-0.6B"
    eng = ["model_name", "engine"]
    running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", eng, registry=reg)
    waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", eng, registry=reg)
    by_reason = Gauge("vllm:num_requests_waiting_by_reason", "Number of requests waiting, by reason.", eng + ["reason"], registry=reg)
    kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", eng, registry=reg)
    pq = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", eng, registry=reg)
    ph = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", eng, registry=reg)
    pre = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", eng, registry=reg)
    pt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", eng, registry=reg)
    gt = Counter("vllm:generation_tokens", "Number of generation tokens processed.", eng, registry=reg)
    ok = Counter("vllm:request_success", "Count of successfully processed requests.", eng + ["finished_reason"], registry=reg)
    tok_buckets = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
    rpt = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", eng, buckets=tok_buckets, registry=reg)
    rgt = Histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", eng, buckets=tok_buckets, registry=reg)
    it = Histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", eng,
                   buckets=[1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384], registry=reg)
    ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", eng,
                     buckets=[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0], registry=reg)
    itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", eng,
                    buckets=[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0], registry=reg)
    lat_buckets = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
    e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", eng, buckets=lat_buckets, registry=reg)
    qt = Histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", eng, buckets=lat_buckets, registry=reg)
    info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                 ["block_size", "cache_dtype", "enable_prefix_caching", "gpu_memory_utilization", "num_gpu_blocks", "engine"], registry=reg)
    http = Counter("http_requests", "Total number of requests by method, status and handler.", ["handler", "method", "status"], registry=reg)

    state = {"0": (7, 3, 0.4321, 0.75), "1": (5, 0, 0.25, 0.5)}
    for e, (r, w, u, scale) in state.items():
        running.labels(model, e).set(r)
        waiting.labels(model, e).set(w)
        by_reason.labels(model, e, "capacity").set(w)
        by_reason.labels(model, e, "deferred").set(0)
        kv.labels(model, e).set(u)
        pq.labels(model, e).inc(409600 * scale)
        ph.labels(model, e).inc(262144 * scale)
        pre.labels(model, e).inc(0)
        pt.labels(model, e).inc(512000 * scale)
        gt.labels(model, e).inc(96000 * scale)
        ok.labels(model, e, "stop").inc(int(900 * scale))
        ok.labels(model, e, "length").inc(int(100 * scale))
        ok.labels(model, e, "abort").inc(0)
        for v in (120, 480, 1600, 3000):
            rpt.labels(model, e).observe(v)
            rgt.labels(model, e).observe(v / 8)
            it.labels(model, e).observe(v * 2)
        for v in (0.012, 0.034, 0.21, 1.7):
            ttft.labels(model, e).observe(v)
            itl.labels(model, e).observe(v / 10)
            e2e.labels(model, e).observe(v * 20)
            qt.labels(model, e).observe(v / 2)
        info.labels("16", "auto", "True", "0.9", "27480", e).set(1)
    http.labels("/v1/chat/completions", "POST", "2xx").inc(2000)
    http.labels("/metrics", "GET", "2xx").inc(31)
    return generate_latest(reg)


def sglang():
    reg = CollectorRegistry()
    std(reg)
    lab = ["model_name", "engine_type", "tp_rank", "pp_rank", "dp_rank"]
    running = Gauge("sglang:num_running_reqs", "The number of running requests.", lab, registry=reg)
    queue = Gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", lab, registry=reg)
    usage = Gauge("sglang:token_usage", "The token usage.", lab, registry=reg)
    used = Gauge("sglang:num_used_tokens", "The number of used tokens.", lab, registry=reg)
    maxtok = Gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", lab, registry=reg)
    hit = Gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", lab, registry=reg)
    thr = Gauge("sglang:gen_throughput", "The generation throughput (token/s).", lab, registry=reg)
    pt = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.", ["model_name"], registry=reg)
    gt = Counter("sglang:generation_tokens", "Number of generation tokens processed.", ["model_name"], registry=reg)
    ct = Counter("sglang:cached_tokens", "Number of cached prompt tokens.", ["model_name", "cache_source"], registry=reg)
    ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ["model_name"],
                     buckets=[0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 120, 160], registry=reg)
    model = "meta-llama/Llama-3.1-8B-Instruct"
    for dp, (r, q, u) in {"0": (11, 4, 0.61), "1": (9, 2, 0.39)}.items():
        l = (model, "unified", "0", "0", dp)
        running.labels(*l).set(r)
        queue.labels(*l).set(q)
        usage.labels(*l).set(u)
        used.labels(*l).set(int(u * 500000))
        maxtok.labels(*l).set(500000)
        hit.labels(*l).set(0.42)
        thr.labels(*l).set(1834.5)
    pt.labels(model).inc(8.1e6)
    gt.labels(model).inc(1.2e6)
    ct.labels(model, "device").inc(3.4e6)
    ct.labels(model, "host").inc(1.1e5)
    for v in (0.05, 0.3, 0.9, 7.0):
        ttft.labels(model).observe(v)
    return generate_latest(reg)


for name, body in (("vllm_metrics.txt", vllm()), ("sglang_metrics.txt", sglang())):
    with open(os.path.join(here, name), "wb") as f:
        f.write(body)
