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

// TestDisaggPrecise: precise_cache_aware ranks a disaggregated route's prefill pool by the KV events of the
// prefill engines: once an engine's blocks of a prompt are indexed, the prompt's next request is
// prefilled there again, a prefix hit, whichever decode engine generates it.
func TestDisaggPrecise(t *testing.T) {
	prefill, _, cfg := pdFleet(t, 2, 2, "precise_cache_aware", "prefill_threshold_tokens = 0", func(c *sim.Config) {
		if c.Role == sim.RolePrefill {
			c.KVEvents = "tcp://127.0.0.1:*"
		}
	})
	for i, e := range prefill {
		cfg = strings.Replace(cfg, fmt.Sprintf("name = \"p%d\"\napi_base = %q\n", i, e.URL()),
			fmt.Sprintf("name = \"p%d\"\napi_base = %q\n[providers.kv_events]\nendpoint = %q\nstale_secs = 60\n", i, e.URL(), e.KVEventsEndpoint()), 1)
	}
	gw := startGateway(t, cfg)
	time.Sleep(200 * time.Millisecond) // the SUB sockets connect (ZMQ's slow joiner)
	msgs := longConversation("disaggregated")
	body, _ := json.Marshal(map[string]any{"model": "up-model", "messages": msgs, "add_generation_prompt": true})
	resp, got := post(t, prefill[0].URL()+"/tokenize", string(body))
	if resp.StatusCode != 200 {
		t.Fatalf("tokenize: %d %s", resp.StatusCode, got)
	}
	var tk struct{ Tokens []uint32 }
	_ = json.Unmarshal([]byte(got), &tk)
	ids := strings.Trim(strings.ReplaceAll(fmt.Sprint(tk.Tokens), " ", ","), "[]")
	turn := func() (string, string) {
		b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "max_tokens": 2})
		resp, out := post(t, gw.URL+"/v1/chat/completions", string(b), "X-Rolter-Vllm-Token-Ids", ids)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, out)
		}
		return resp.Header.Get("X-Rolter-Prefill-Target"), resp.Header.Get("X-Rolter-Decision")
	}
	first, _ := turn()
	st := gw.g.Snapshot().kv[first].st
	waitFor(t, 5*time.Second, "the prefill engine's BlockStored events", func() bool { return st.Stats().StoredEvents > 0 && st.Trusted() })
	for range 3 {
		if again, decision := turn(); again != first || decision != "prefix_hit" {
			t.Fatalf("blocks are on prefill engine %s; the prompt went to %s (%s)", first, again, decision)
		}
	}
}
