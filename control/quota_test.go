package control

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/engine"
)

// quotaFile is the env's file config with small [control.quotas].
func quotaFile(e *env) {
	e.t.Helper()
	e.file.Store(parseFile(e.t, fileConfigText(e.S.URL)+`[control.quotas]
routing_memory_bytes = 1048576
routes = 2
providers = 2
targets_per_route = 2
targets = 3
keys = 2
tokens = 2
`))
	if err := e.srv.Reload(); err != nil {
		e.t.Fatal(err)
	}
}

// TestTrieCeilingQuota: the attack - an org admin PUTs a route with max_trie_bytes of 1 TiB - is
// refused as quota_exceeded; a route within the quota is taken, and twenty distinct long prompts leave
// its trie within its ceiling (the trie stats of GET /api/v1/state).
func TestTrieCeilingQuota(t *testing.T) {
	e := newEnv(t, "")
	quotaFile(e)
	org := e.mkOrg("tenant")
	token, _ := e.mkToken(org)
	key, _ := e.mkKey(org, token)
	put := func(maxBytes int) apiResp {
		return e.api.do("PUT", "/api/v1/orgs/"+org+"/routes/chat", token, map[string]any{
			"strategy": "cache_aware", "targets": []map[string]any{{"provider": "shared"}},
			"params": map[string]any{"max_trie_bytes": maxBytes}})
	}
	r := put(1 << 40)
	we := want(t, r, http.StatusForbidden, "quota_exceeded", "routing_memory_bytes")
	if len(we.Error.Fields) != 1 || we.Error.Fields[0].Field != "params.max_trie_bytes" {
		t.Fatalf("fields %+v, want params.max_trie_bytes", we.Error.Fields)
	}
	// 1 MiB of routing memory per org: 2.5 x 500 KiB does not fit.
	want(t, put(500<<10), http.StatusForbidden, "quota_exceeded")
	const ceiling = 16 << 10
	want(t, put(ceiling), http.StatusCreated, "")

	for i := range 20 {
		prompt := fmt.Sprintf("conversation %d: %s", i, strings.Repeat(fmt.Sprintf("distinct text %d ", i), 400))
		body := fmt.Sprintf(`{"model":"chat","messages":[{"role":"user","content":%q}]}`, prompt)
		req, _ := http.NewRequest("POST", e.gwURL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("prompt %d: status %d", i, resp.StatusCode)
		}
	}
	var st struct {
		Routes []engine.RouteState `json:"routes"`
	}
	e.api.do("GET", "/api/v1/state", token, nil).json(t, &st)
	if len(st.Routes) != 1 || len(st.Routes[0].Targets) != 1 || st.Routes[0].Targets[0].TriePromptBytes == nil {
		t.Fatalf("state %+v", st.Routes)
	}
	if got := *st.Routes[0].Targets[0].TriePromptBytes; got == 0 || got > ceiling {
		t.Fatalf("the trie holds %d prompt bytes, want some and at most the ceiling %d", got, ceiling)
	}
}

// TestCountQuotas: each count of [control.quotas] refuses the write past it with 403 quota_exceeded, for
// an org admin and the superadmin alike, and an object that exists can still be replaced or deleted.
func TestCountQuotas(t *testing.T) {
	e := newEnv(t, "")
	quotaFile(e)
	org := e.mkOrg("tenant")
	token, _ := e.mkToken(org)
	do := func(method, path string, body any) apiResp {
		return e.api.do(method, "/api/v1/orgs/"+org+path, token, body)
	}
	quota := func(r apiResp, parts ...string) {
		t.Helper()
		want(t, r, http.StatusForbidden, "quota_exceeded", parts...)
	}

	want(t, do("POST", "/providers", provider("a", e.A.URL)), 201, "")
	want(t, do("POST", "/providers", provider("b", e.B.URL)), 201, "")
	quota(do("POST", "/providers", provider("c", e.B.URL)), "2 providers")
	quota(e.su("POST", "/api/v1/orgs/"+org+"/providers", provider("c", e.B.URL)), "2 providers")
	want(t, do("PUT", "/providers/b", provider("b", e.A.URL)), 200, "")

	quota(do("POST", "/routes", route("r1", "a", "b", "shared")), "3 targets, over the quota of 2 per route")
	want(t, do("POST", "/routes", route("r1", "a")), 201, "")
	want(t, do("POST", "/routes", route("r2", "a", "b")), 201, "")
	quota(do("POST", "/routes", route("r3", "a")), "2 routes")
	quota(do("PUT", "/routes/r1", route("r1", "a", "shared")), "4 targets, over its quota of 3")
	want(t, do("PUT", "/routes/r2", route("r2", "b")), 200, "")
	want(t, do("DELETE", "/routes/r2", nil), 204, "")
	want(t, do("POST", "/routes", route("r3", "a")), 201, "")

	_, id := e.mkKey(org, token)
	e.mkKey(org, token)
	quota(do("POST", "/keys", map[string]string{"name": "third"}), "2 keys")
	want(t, do("DELETE", "/keys/"+id, nil), 204, "")
	e.mkKey(org, token)

	e.mkToken(org)
	quota(e.su("POST", "/api/v1/orgs/"+org+"/tokens", map[string]string{"name": "third"}), "2 tokens")
}

// TestMetricsEndpoint: GET /api/v1/metrics shows an org token its org's series only, and the superadmin
// every series, while the data plane's anonymous /metrics names no org's route.
func TestMetricsEndpoint(t *testing.T) {
	e := newEnv(t, "")
	org := e.mkOrg("tenant")
	token, _ := e.mkToken(org)
	want(t, e.api.do("POST", "/api/v1/orgs/"+org+"/routes", token, route("private-model", "shared")), 201, "")
	e.wantChat("private-model", e.orgKey(org), 200, "")
	e.wantChat("pub", "", 200, "")
	other := e.mkOrg("other")
	otherToken, _ := e.mkToken(other)
	get := func(tok string) string {
		r := e.api.do("GET", "/api/v1/metrics", tok, nil)
		want(t, r, 200, "")
		return string(r.body)
	}
	if got := get(token); !strings.Contains(got, `route="private-model"`) || strings.Contains(got, `route="pub"`) {
		t.Fatalf("the org's metrics:\n%s", got)
	}
	if got := get(otherToken); strings.Contains(got, "private-model") {
		t.Fatal("another org's token sees the org's series")
	}
	if got := get(rootToken); !strings.Contains(got, `route="private-model"`) || !strings.Contains(got, `route="pub"`) {
		t.Fatal("the superadmin's metrics lack series")
	}
	resp, err := http.Get(e.gwURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if strings.Contains(string(b), "private-model") {
		t.Fatal("the anonymous scrape names the org's route")
	}
}
