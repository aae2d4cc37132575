//go:build cgo

package control

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/sim"
)

// TestAPIAddKVSource: an org admin adds a kv_events source to a provider that had none and switches its
// route to precise_cache_aware. The provider is otherwise unchanged, so the reload keeps it; the source
// once came from the kept provider's old config - nil - and the write panicked, stayed in the store, and
// made every later write of any org panic too. Now it is applied: the gateway subscribes to the new
// endpoint and ingests its events, and another org's writes go on working.
func TestAPIAddKVSource(t *testing.T) {
	e := newEnv(t, "")
	a, b := e.mkOrg("a"), e.mkOrg("b")
	scfg := sim.DefaultConfig()
	scfg.KVEvents = "tcp://127.0.0.1:*"
	engine, err := sim.New(scfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := engine.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(engine.Stop)
	token, _ := e.mkToken(a)
	base := "/api/v1/orgs/" + a
	want(t, e.api.do("POST", base+"/providers", token, provider("p", engine.URL())), 201, "")
	simRoute := func(strategy string) map[string]any {
		return map[string]any{"model": "r", "strategy": strategy, "targets": []map[string]any{{"provider": "p", "model": "sim-model"}}}
	}
	want(t, e.api.do("POST", base+"/routes", token, simRoute("round_robin")), 201, "")

	withKV := map[string]any{"api_base": engine.URL(), "kv_events": map[string]any{"endpoint": engine.KVEventsEndpoint()}}
	want(t, e.api.do("PUT", base+"/providers/p", token, withKV), 200, "")
	want(t, e.api.do("PUT", base+"/routes/r", token, simRoute("precise_cache_aware")), 200, "")

	name := a + "/p"
	if built := e.gw.Built(); !strings.Contains(built, fmt.Sprintf("subscribed=true {Endpoint:%s ", engine.KVEventsEndpoint())) {
		t.Fatalf("the gateway is not subscribed to %s:\n%s", engine.KVEventsEndpoint(), built)
	}
	// Events the engine publishes reach the new source (the first may go out before the subscriber is
	// connected: ZMQ's slow joiner, so conversations are sent until one gets through).
	stored := regexp.MustCompile(`rolter_kv_events_total\{target="` + regexp.QuoteMeta(name) + `",kind="stored"\} ([1-9][0-9]*)`)
	deadline := time.Now().Add(10 * time.Second)
	for n := 0; !stored.MatchString(gatewayMetrics(t, e)); n++ {
		if time.Now().After(deadline) {
			t.Fatalf("the engine's KV events never reached the gateway:\n%s", gatewayMetrics(t, e))
		}
		body := fmt.Sprintf(`{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"kv reload %d %s"}]}`, n,
			strings.Repeat("long prompt ", 50))
		resp, err := http.Post(engine.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		time.Sleep(20 * time.Millisecond)
	}
	e.wantChat("r", e.orgKey(a), 200, name)

	// Another org's writes are applied as before.
	want(t, e.su("POST", "/api/v1/orgs/"+b+"/providers", provider("bp", e.B.URL)), 201, "")
	want(t, e.su("POST", "/api/v1/orgs/"+b+"/routes", route("br", "bp")), 201, "")
	e.wantChat("br", e.orgKey(b), 200, b+"/bp")
}

// gatewayMetrics is the gateway's metrics as the superadmin reads them (the anonymous /metrics leaves out
// the series of orgs' providers).
func gatewayMetrics(t *testing.T, e *env) string {
	t.Helper()
	r := e.su("GET", "/api/v1/metrics", nil)
	want(t, r, 200, "")
	return string(r.body)
}
