//go:build cgo

package engine

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/sim"
)

// TestLoadBoundSixStreamsPrecise: the six streams of TestLoadBoundSixStreams under precise_cache_aware,
// routed by the engines' own KV events over ZMQ: the stream's blocks are resident on the first engine it
// reached, and the others still spill to the lighter engine under the default bound.
func TestLoadBoundSixStreamsPrecise(t *testing.T) {
	engines := boundFleet(t, func(c *sim.Config) { c.KVEvents = "tcp://127.0.0.1:*" })
	extra := make([]string, len(engines))
	for i, e := range engines {
		extra[i] = fmt.Sprintf("[providers.kv_events]\nendpoint = %q\nstale_secs = 60\n", e.KVEventsEndpoint())
	}
	gw := startGateway(t, boundConfig("precise_cache_aware", "", engines, extra))
	time.Sleep(200 * time.Millisecond) // the SUB sockets connect (ZMQ's slow joiner)
	body, _ := json.Marshal(map[string]any{"model": "up-model", "add_generation_prompt": true,
		"messages": []chatMsg{{"system", strings.Repeat("one long agent context that every stream shares ", 60)}, {"user", "go on"}}})
	resp, got := post(t, engines[0].URL()+"/tokenize", string(body))
	if resp.StatusCode != 200 {
		t.Fatalf("tokenize: %d %s", resp.StatusCode, got)
	}
	var tk struct{ Tokens []uint32 }
	_ = json.Unmarshal([]byte(got), &tk)
	ids := strings.Trim(strings.ReplaceAll(fmt.Sprint(tk.Tokens), " ", ","), "[]")
	targets, decisions := sixStreams(t, gw, "X-Rolter-Vllm-Token-Ids", ids)
	hits := 0
	for _, d := range decisions {
		if d == "prefix_hit" {
			hits++
		}
	}
	if hits == 0 {
		t.Fatalf("no stream was routed by its resident blocks: %v", decisions)
	}
	checkBounded(t, 8, targets, decisions)
}
