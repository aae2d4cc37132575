package engine

import (
	"encoding/json"
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
