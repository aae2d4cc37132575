//go:build cgo

package engine

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/sim"
)

// kvReloadConfig renders provider sim-0 over e, with kv_events on endpoint (none when ""), and route m with
// strategy.
func kvReloadConfig(e *sim.Engine, endpoint, strategy string) string {
	s := fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\n[[providers]]\nname = \"sim-0\"\napi_base = %q\n", e.URL())
	if endpoint != "" {
		s += fmt.Sprintf("[providers.kv_events]\nendpoint = %q\nstale_secs = 60\n", endpoint)
	}
	return s + fmt.Sprintf("[[routes]]\nmodel = \"m\"\nstrategy = %q\n[[routes.targets]]\nprovider = \"sim-0\"\nmodel = \"sim-model\"\n", strategy)
}

// waitEventsFrom sends conversations to e directly until its KV events reach the gateway's source of
// provider (a publisher's first batches may go out before the subscriber is connected).
func waitEventsFrom(t *testing.T, gw *testGateway, e *sim.Engine, provider string) {
	t.Helper()
	src := gw.g.Snapshot().kv[provider]
	if src == nil {
		t.Fatalf("the live snapshot has no KV-event source for %s", provider)
	}
	deadline := time.Now().Add(10 * time.Second)
	for n := 0; src.st.Stats().StoredEvents == 0; n++ {
		if time.Now().After(deadline) {
			t.Fatalf("%s's events never reached the gateway: %+v", e.KVEventsEndpoint(), src.st.Stats())
		}
		msgs := longConversation(fmt.Sprintf("kvreload %d", n))
		body := fmt.Sprintf(`{"model":"sim-model","max_tokens":2,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`,
			msgs[0].Content, msgs[1].Content)
		if resp, got := post(t, e.URL()+"/v1/chat/completions", body); resp.StatusCode != 200 {
			t.Fatalf("sim: %d %s", resp.StatusCode, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// subscribedEndpoint is the endpoint the KV-event subscriber runs provider's subscription on.
func subscribedEndpoint(t *testing.T, gw *testGateway, provider string) string {
	t.Helper()
	src := gw.g.Snapshot().kv[provider]
	if src == nil {
		t.Fatalf("the live snapshot has no KV-event source for %s", provider)
	}
	c, ok := gw.g.kv.sub.Config(src.id)
	if !ok {
		t.Fatalf("the subscriber holds no subscription for %s (id %d)", provider, src.id)
	}
	return c.Endpoint
}

// TestReloadFileAddsKVSource: SIGHUP with a file that adds a kv_events source to a provider that had none
// and switches its route to precise_cache_aware. The provider is otherwise unchanged, so it is carried
// over; the source must still come from the new file (it once came from the carried provider's old
// config, nil here, and the process died). The gateway keeps serving, subscribed to the new endpoint.
func TestReloadFileAddsKVSource(t *testing.T) {
	engines, _ := simFleet(t, 1, func(c *sim.Config) { c.KVEvents = "tcp://127.0.0.1:*" })
	e := engines[0]
	path := filepath.Join(t.TempDir(), "rolter.toml")
	gw := startGateway(t, kvReloadConfig(e, "", "round_robin"))
	if err := os.WriteFile(path, []byte(kvReloadConfig(e, e.KVEventsEndpoint(), "precise_cache_aware")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := gw.g.ReloadFile(path); err != nil {
		t.Fatalf("reload: %s", err)
	}
	if got := gw.g.Snapshot().Routes[0].StrategyName; got != "precise_cache_aware" {
		t.Fatalf("the route runs %s after the reload", got)
	}
	if got := subscribedEndpoint(t, gw, "sim-0"); got != e.KVEventsEndpoint() {
		t.Fatalf("subscribed to %q, want the new endpoint %q", got, e.KVEventsEndpoint())
	}
	waitEventsFrom(t, gw, e, "sim-0")
	if resp, body := post(t, gw.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`); resp.StatusCode != 200 {
		t.Fatalf("after the reload: %d %s", resp.StatusCode, body)
	}
}

// TestReloadMovesKVSource: a reload that changes only a provider's kv_events endpoint moves the
// subscription to the new endpoint (it once kept the old one and acknowledged the change).
func TestReloadMovesKVSource(t *testing.T) {
	engines, _ := simFleet(t, 2, func(c *sim.Config) { c.KVEvents = "tcp://127.0.0.1:*" })
	a, b := engines[0], engines[1]
	gw := startGateway(t, kvReloadConfig(a, a.KVEventsEndpoint(), "precise_cache_aware"))
	before := gw.g.Snapshot().Providers[0]
	mustReload(t, gw, kvReloadConfig(a, b.KVEventsEndpoint(), "precise_cache_aware"))
	if gw.g.Snapshot().Providers[0] != before {
		t.Fatal("a change of kv_events alone replaced the provider (its pool, load and health)")
	}
	if got := subscribedEndpoint(t, gw, "sim-0"); got != b.KVEventsEndpoint() {
		t.Fatalf("subscribed to %q after the reload, want %q", got, b.KVEventsEndpoint())
	}
	waitEventsFrom(t, gw, b, "sim-0")
}
