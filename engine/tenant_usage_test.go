package engine

import (
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/config"
)

// TestTenantUsage: each key's requests are counted by model with the tokens of their answers' usage,
// refused ones apart; a drain takes what is new since the last one; /metrics shows a key's usage to its
// org only.
func TestTenantUsage(t *testing.T) {
	up := newFakeUpstream(t, okJSON) // usage: prompt 3, completion 1 (okJSON)
	cfg := keyedConfig(t, up.URL)
	cfg.Keys[0].ID, cfg.Keys[1].ID = "key_one", "key_two"
	cfg.Keys[0].Limits = &config.Limits{RPM: 3}
	gw := startGatewayConfig(t, cfg, Options{})
	send := func(model, key string, want int) {
		t.Helper()
		if resp, body := post(t, gw.URL+"/v1/chat/completions", chatBody(model, "x", false), "Authorization", "Bearer "+key); resp.StatusCode != want {
			t.Fatalf("%s: %d %s", model, resp.StatusCode, body)
		}
	}
	for range 3 {
		send("m1", "sk-one", 200)
	}
	send("m1", "sk-one", 429)
	send("m2", "sk-two", 200)
	send("pub", "sk-two", 200) // a key's requests to a public route are its usage too
	rows := gw.g.DrainUsage(nil)
	got := map[string]UsageRow{}
	for _, r := range rows {
		got[r.Key+"/"+r.Model] = r
	}
	one := got["key_one/m1"]
	if len(rows) != 3 || one.Org != "org1" || one.Requests != 3 || one.Refused != 1 || one.PromptTokens != 9 || one.CompletionTokens != 3 ||
		got["key_two/m2"].Requests != 1 || got["key_two/pub"].PromptTokens != 3 {
		t.Fatalf("usage %+v", rows)
	}
	if rows := gw.g.DrainUsage(nil); len(rows) != 0 {
		t.Fatalf("a second drain with nothing new: %+v", rows)
	}
	send("m2", "sk-two", 200)
	if rows := gw.g.DrainUsage(nil); len(rows) != 1 || rows[0].Requests != 1 || rows[0].CompletionTokens != 1 {
		t.Fatalf("after one more request: %+v", rows)
	}
	var org1, anon strings.Builder
	gw.g.WriteMetrics(&org1, "org1")
	gw.g.WriteMetrics(&anon, "")
	if !strings.Contains(org1.String(), `rolter_tenant_requests_total{org="org1",key="key_one",model="m1",result="refused"} 1`) ||
		strings.Contains(org1.String(), `key="key_two"`) || strings.Contains(anon.String(), "rolter_tenant_") {
		t.Fatalf("usage series: org1 sees\n%s\nanonymous sees tenant series: %v", org1.String(), strings.Contains(anon.String(), "rolter_tenant_"))
	}
}
