package engine

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// vllmMetrics serves a vLLM-style /metrics with the given queue and otherwise answers chat requests.
func vllmMetrics(waiting *atomic.Int64, hits *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			n := waiting.Load()
			if n < 0 {
				w.WriteHeader(500)
				return
			}
			fmt.Fprintf(w, "# HELP vllm:num_requests_running Number of requests in model execution batches.\n# TYPE vllm:num_requests_running gauge\n"+
				"vllm:num_requests_running{engine=\"0\",model_name=\"up-model\"} %d.0\n"+
				"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n# TYPE vllm:num_requests_waiting gauge\n"+
				"vllm:num_requests_waiting{engine=\"0\",model_name=\"up-model\"} %d.0\n", min(n, 8), max(0, n-8))
			return
		}
		hits.Add(1)
		okJSON(w, r)
	}
}

// TestScrapedQueueSteersLoad: least_load moves away from an engine whose own queue is deep (other clients
// load it), and a failing scrape stops counting instead of leaving a stale number.
func TestScrapedQueueSteersLoad(t *testing.T) {
	var qa, qb, ha, hb atomic.Int64
	qa.Store(30)
	ua := newFakeUpstream(t, vllmMetrics(&qa, &ha))
	ub := newFakeUpstream(t, vllmMetrics(&qb, &hb))
	gw := startGateway(t, gatewayConfig("least_load", "[metrics_scrape]\nenabled = true\ninterval_secs = 0.05\ntimeout_secs = 0.5\n", ua.URL, ub.URL))
	pa := gw.g.Snapshot().Providers[0]
	waitFor(t, 3*time.Second, "the first scrape", func() bool { return pa.Load() == 30 })
	for i := 0; i < 20; i++ {
		post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
	}
	if ha.Load() != 0 || hb.Load() != 20 {
		t.Fatalf("deep-queue engine still got traffic: a=%d b=%d", ha.Load(), hb.Load())
	}
	qa.Store(-1) // its /metrics starts failing
	waitFor(t, 3*time.Second, "the failed scrape to stop counting", func() bool { return pa.Load() == 0 })
	for i := 0; i < 40; i++ {
		post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
	}
	if ha.Load() < 5 {
		t.Fatalf("a failed scrape kept steering traffic away: a=%d b=%d", ha.Load(), hb.Load())
	}
}
