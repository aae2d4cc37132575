package engine

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

func TestLMCacheAwareRules(t *testing.T) {
	r := testRoute(t, "lmcache_aware", []float64{1, 1, 1, 1}, "")
	var buf, tmp [maxTargets]int
	var p Pick
	allEligible(r, &p, buf[:])
	p.tmp = tmp[:0]
	now := time.Now().UnixNano()
	p.Now = now
	set := func(i int, occ float64, avail bool) {
		src := &lmcacheSource{maxAge: int64(time.Minute)}
		src.status.Store(occ, avail, now)
		r.Targets[i].Provider.lmcache = src
	}
	f := func(want int, reason Reason) {
		t.Helper()
		if got, d := rank(r, &p); got != want || d.Reason != reason {
			t.Fatalf("got %d %s, want %d %s", got, d.Reason, want, reason)
		}
	}
	// No sources at all: least load.
	r.Targets[0].Provider.inflight.Store(2)
	r.Targets[1].Provider.inflight.Store(1)
	r.Targets[2].Provider.inflight.Store(3)
	r.Targets[3].Provider.inflight.Store(3)
	f(1, ReasonLeastLoad)
	// The available target with the lowest occupancy wins.
	set(0, 0.7, true)
	set(2, 0.2, true)
	set(3, 0.1, false)
	f(2, ReasonCacheAvail)
	// Overloaded: least load instead, skipping the known-unavailable target.
	r.Targets[2].Provider.inflight.Store(9)
	f(1, ReasonLeastLoad)
	// A stale status is neutral.
	r.Targets[2].Provider.inflight.Store(3)
	p.Now = now + int64(2*time.Minute)
	f(1, ReasonLeastLoad)
}

// TestLMCachePolling: the gateway polls [providers.lmcache] endpoints and routes by them.
func TestLMCachePolling(t *testing.T) {
	var occA, occB atomic.Value
	occA.Store("0.9")
	occB.Store("0.1")
	status := func(v *atomic.Value) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/lmcache/status" {
				fmt.Fprintf(w, `{"occupancy": %s, "cache_available": true}`, v.Load())
				return
			}
			okJSON(w, r)
		}
	}
	ua, ub := newFakeUpstream(t, status(&occA)), newFakeUpstream(t, status(&occB))
	cfg := fmt.Sprintf(`[server]
listen = "127.0.0.1:0"
[[providers]]
name = "a"
api_base = %q
[providers.lmcache]
endpoint = "%s/lmcache/status"
refresh_secs = 0.05
[[providers]]
name = "b"
api_base = %q
[providers.lmcache]
endpoint = "%s/lmcache/status"
refresh_secs = 0.05
[[routes]]
model = "m"
strategy = "lmcache_aware"
[[routes.targets]]
provider = "a"
[[routes.targets]]
provider = "b"
`, ua.URL, ua.URL, ub.URL, ub.URL)
	gw := startGateway(t, cfg)
	waitFor(t, 3*time.Second, "both polls", func() bool {
		for _, p := range gw.g.Snapshot().Providers {
			if _, _, ok := p.lmcache.get(time.Now().UnixNano()); !ok {
				return false
			}
		}
		return true
	})
	for i := 0; i < 5; i++ {
		resp, _ := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
		if resp.Header.Get("X-Rolter-Target") != "b" || resp.Header.Get("X-Rolter-Decision") != "cache_available" {
			t.Fatalf("went to %s (%s)", resp.Header.Get("X-Rolter-Target"), resp.Header.Get("X-Rolter-Decision"))
		}
	}
	occA.Store("0.05")
	waitFor(t, 3*time.Second, "the new occupancy to steer", func() bool {
		resp, _ := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
		return resp.Header.Get("X-Rolter-Target") == "a"
	})
}
