package engine

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestState: the state view shows each target's load, eligibility and why, its trie, and the route's
// decisions.
func TestState(t *testing.T) {
	up1, up2 := newFakeUpstream(t, okJSON), newFakeUpstream(t, okJSON)
	gw := startGateway(t, gatewayConfig("cache_aware", "", up1.URL, up2.URL))
	post(t, gw.URL+"/v1/chat/completions", chatBody("m", "state", false))
	gw.g.Snapshot().Providers[1].health.coolUntil.Store(time.Now().Add(time.Minute).UnixNano())
	st := gw.g.State()
	if st.Generation != 1 || len(st.Routes) != 1 || len(st.Routes[0].Targets) != 2 {
		t.Fatalf("state %+v", st)
	}
	r := st.Routes[0]
	if r.Strategy != "cache_aware" || r.Decisions["home"] != 1 {
		t.Fatalf("route state %+v", r)
	}
	a, b := r.Targets[0], r.Targets[1]
	if !a.Eligible || b.Eligible || b.Why != "cooling down" {
		t.Fatalf("eligibility: %+v / %+v", a, b)
	}
	if a.TrieNodes == nil || b.TrieNodes == nil || *a.TrieNodes+*b.TrieNodes == 0 {
		t.Fatalf("tries: %+v / %+v", a, b)
	}
	if _, err := json.Marshal(st); err != nil {
		t.Fatal(err)
	}
}

// TestStateDisaggregation: a disaggregated route shows its protocol, threshold and bootstrap port, its
// prefill pool as its targets and its decode pool apart, each target with its own load and eligibility,
// and the requests' hops; a route that is not disaggregated shows none of it.
func TestStateDisaggregation(t *testing.T) {
	_, _, cfg := pdFleet(t, 1, 2, "cache_aware", "prefill_threshold_tokens = 64", nil)
	cfg += "[[routes]]\nmodel = \"whole\"\n[[routes.targets]]\nprovider = \"p0\"\nmodel = \"up-model\"\n"
	gw := startGateway(t, cfg)
	for i := range 3 {
		if resp, out := post(t, gw.URL+"/v1/chat/completions", chatBody("m", longPrompt(fmt.Sprint("state ", i)), false)); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, out)
		}
	}
	gw.g.Snapshot().Providers[2].health.coolUntil.Store(time.Now().Add(time.Minute).UnixNano()) // d1
	st := gw.g.State()
	if len(st.Routes) != 2 || st.Routes[1].Disaggregation != nil {
		t.Fatalf("routes %+v", st.Routes)
	}
	r := st.Routes[0]
	pd := r.Disaggregation
	if pd == nil || len(r.Targets) != 1 || r.Targets[0].Provider != "p0" || r.Targets[0].TrieNodes == nil || r.Targets[0].Requests != 3 {
		t.Fatalf("route %+v", r)
	}
	if pd.Protocol != "vllm" || pd.PrefillThresholdTokens != 64 || pd.BootstrapPort != nil || len(pd.Decode) != 2 {
		t.Fatalf("disaggregation %+v", pd)
	}
	d0, d1 := pd.Decode[0], pd.Decode[1]
	if d0.Provider != "d0" || d1.Provider != "d1" || d0.Model != "up-model" || d0.Weight != 1 || d0.TrieNodes != nil {
		t.Fatalf("decode pool %+v", pd.Decode)
	}
	if !d0.Eligible || d1.Eligible || d1.Why != "cooling down" || d0.Requests+d1.Requests != 3 {
		t.Fatalf("decode pool %+v", pd.Decode)
	}
	if pd.Hops.PrefillOK != 3 || pd.Hops.PrefillFailed != 0 || pd.Hops.DecodeFailed != 0 || pd.Reprefills != 0 {
		t.Fatalf("hops %+v, reprefills %d", pd.Hops, pd.Reprefills)
	}
	data, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, part := range []string{`"disaggregation":{"protocol":"vllm","prefill_threshold_tokens":64,"decode":[{"provider":"d0"`, `"hops":{"prefill_ok":3,`} {
		if !strings.Contains(string(data), part) {
			t.Fatalf("state JSON without %s: %s", part, data)
		}
	}
}

// TestStateDisaggregationSGLang: an sglang route shows its bootstrap port.
func TestStateDisaggregationSGLang(t *testing.T) {
	_, _, cfg := pdFleet(t, 1, 1, "least_load", "protocol = \"sglang\"\nbootstrap_port = 9001", nil)
	pd := startGateway(t, cfg).g.State().Routes[0].Disaggregation
	if pd == nil || pd.Protocol != "sglang" || pd.BootstrapPort == nil || *pd.BootstrapPort != 9001 || pd.PrefillThresholdTokens != 0 || len(pd.Decode) != 1 {
		t.Fatalf("disaggregation %+v", pd)
	}
}
