package engine

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/sim"
)

// TestEngineRestartResetsTrie: after an engine restart (its process stopped and a new
// one started on the same port), once the gateway has seen it - a new process_start_time_seconds, or the
// target back from unhealthy - the first requests are not routed to it as prefix_hit on stale evidence.
func TestEngineRestartResetsTrie(t *testing.T) {
	engines, urls := simFleet(t, 2, nil)
	extra := "[metrics_scrape]\nenabled = true\ninterval_secs = 0.05\n[health]\nenabled = true\ninterval_secs = 0.05\nunhealthy_threshold = 1\nhealthy_threshold = 1\n"
	gw := startGateway(t, strings.ReplaceAll(gatewayConfig("cache_aware", extra, urls...), "up-model", sim.DefaultConfig().Model))
	system := strings.Repeat("A long shared system prompt about restarts. ", 20)
	ask := func(q string) (target, decision string) {
		tg, dec, _, _ := chatTurn(t, gw.URL, "m", []chatMsg{{Role: "system", Content: system}, {Role: "user", Content: q}})
		return tg, dec
	}
	first, _ := ask("first question")
	if tg, dec := ask("second question"); tg != first || dec != "prefix_hit" {
		t.Fatalf("second turn went to %s (%s), want prefix_hit on %s", tg, dec, first)
	}
	idx, _ := strconv.Atoi(strings.TrimPrefix(first, "p"))
	old := engines[idx]
	p := gw.g.snap.Load().providers[first]
	epoch := p.cache.current()
	_, port, _ := net.SplitHostPort(old.Addr())
	old.Stop()
	cfg := old.Config()
	cfg.Port, _ = strconv.Atoi(port)
	var fresh *sim.Engine
	waitFor(t, 5*time.Second, "the port to be free again", func() bool {
		e, err := sim.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if e.Start() != nil {
			return false
		}
		fresh = e
		return true
	})
	t.Cleanup(fresh.Stop)
	waitFor(t, 5*time.Second, "the gateway to see the restart", func() bool { return p.cache.current() != epoch })
	// Until a request resets it, the old trie is not evidence, and the state says so.
	for _, rt := range gw.g.State().Routes {
		for _, ts := range rt.Targets {
			if ts.Provider == first && (len(ts.Evidence) != 1 || ts.Evidence[0] != Evidence{Source: "trie", Trust: "fallback", Reason: "engine_restart"}) {
				t.Fatalf("evidence of the restarted target: %+v", ts.Evidence)
			}
		}
	}
	if _, text := getMetrics(t, gw); metricValue(text, fmt.Sprintf(`rolter_evidence_trust{route="m",target=%q,source="trie"}`, first)) != 2 {
		t.Fatal("rolter_evidence_trust does not say fallback for the restarted target")
	}
	waitFor(t, 5*time.Second, "the target eligible again", func() bool {
		ok, _ := p.health.status(time.Now().UnixNano())
		return ok
	})
	for i := range 3 {
		if tg, dec := ask(fmt.Sprint("question after the restart ", i)); tg == first && dec == "prefix_hit" && i == 0 {
			t.Fatalf("first request after the restart routed to %s as prefix_hit on the old cache's evidence", tg)
		}
	}
	_, text := getMetrics(t, gw)
	resets := 0.0
	for _, r := range []string{"engine_restart", "recovered"} {
		resets += max(0, metricValue(text, fmt.Sprintf(`rolter_engine_cache_resets_total{target=%q,reason=%q}`, first, r)))
	}
	if resets < 1 {
		t.Fatalf("no engine cache reset counted for %s", first)
	}
}

// TestStaleLoopResetsTrie: a target whose engine keeps reporting no cached tokens while its trie predicts
// the whole prompt is reset after stale_window measured responses.
func TestStaleLoopResetsTrie(t *testing.T) {
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":100,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}`)
	})
	gw := startGateway(t, gatewayConfig("cache_aware", "[routes.params]\nstale_window = 5\nstale_gap = 0.5\n", up.URL))
	prompt := strings.Repeat("the same prompt, again and again ", 10)
	var decisions []string
	for range 8 {
		resp, body := post(t, gw.URL+"/v1/chat/completions", chatBody("m", prompt, false))
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		decisions = append(decisions, resp.Header.Get("X-Rolter-Decision"))
	}
	// 1: nothing known (a gap of 0); 2..5: prefix_hit with nothing delivered (gap 1): the fifth measured
	// response brings the average to 0.8 over the window of 5, so the trie is emptied; 6: no prefix known;
	// 7: the trie learnt the prompt again.
	if decisions[1] != "prefix_hit" || decisions[4] != "prefix_hit" || decisions[5] == "prefix_hit" || decisions[6] != "prefix_hit" {
		t.Fatalf("decisions %v: want prefix_hit, then a reset after the window", decisions)
	}
	_, text := getMetrics(t, gw)
	if v := metricValue(text, `rolter_trie_resets_total{route="m",target="p0",reason="stale"}`); v != 1 {
		t.Fatalf("stale resets %v, want 1 (decisions %v)", v, decisions)
	}
}
