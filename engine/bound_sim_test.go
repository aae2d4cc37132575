package engine

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/sim"
)

// The tests of this file send long streams of one prompt through a real gateway to simulated engines of
// weights 2 : 1 over loopback, and read where each went from x-rolter-target.

// boundFleet starts two simulated engines whose streams last long enough for six of them to overlap; tweak,
// when set, adjusts each engine's config.
func boundFleet(t *testing.T, tweak func(c *sim.Config)) []*sim.Engine {
	t.Helper()
	engines, _ := simFleet(t, 2, func(c *sim.Config) {
		c.Model = "up-model"
		c.MaxNumSeqs = 8
		c.DecodePerToken = 10 * time.Millisecond
		if tweak != nil {
			tweak(c)
		}
	})
	return engines
}

// boundConfig is a gateway of one route over engines, the first of weight 2, the second of weight 1, with
// params as its [routes.params] and providerExtra[i] appended to provider i.
func boundConfig(strategy, params string, engines []*sim.Engine, providerExtra []string) string {
	var b strings.Builder
	b.WriteString("[server]\nlisten = \"127.0.0.1:0\"\n")
	for i, e := range engines {
		fmt.Fprintf(&b, "[[providers]]\nname = \"p%d\"\napi_base = %q\n", i, e.URL())
		if providerExtra != nil {
			b.WriteString(providerExtra[i])
		}
	}
	fmt.Fprintf(&b, "[[routes]]\nmodel = \"m\"\nstrategy = %q\n", strategy)
	if params != "" {
		fmt.Fprintf(&b, "[routes.params]\n%s\n", params)
	}
	for i, w := range []int{2, 1} {
		fmt.Fprintf(&b, "[[routes.targets]]\nprovider = \"p%d\"\nmodel = \"up-model\"\nweight = %d\n", i, w)
	}
	return b.String()
}

// sixStreams sends six streams of one long prompt, 40 ms apart - each routed and in flight before the next
// is ranked - and returns the targets and decisions in send order, once every stream ended. hdr are extra
// request headers.
func sixStreams(t *testing.T, gw *testGateway, hdr ...string) (targets, decisions []string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"model": "m", "stream": true, "max_tokens": 60,
		"messages": []chatMsg{{"system", strings.Repeat("one long agent context that every stream shares ", 60)}, {"user", "go on"}},
	})
	targets, decisions = make([]string, 6), make([]string, 6)
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for k := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", gw.URL+"/v1/chat/completions", strings.NewReader(string(body)))
			req.Header.Set("Content-Type", "application/json")
			for j := 0; j+1 < len(hdr); j += 2 {
				req.Header.Set(hdr[j], hdr[j+1])
			}
			resp, err := testClient.Do(req)
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			targets[k], decisions[k] = resp.Header.Get("X-Rolter-Target"), resp.Header.Get("X-Rolter-Decision")
			sc := bufio.NewScanner(resp.Body)
			done := false
			for sc.Scan() {
				done = done || sc.Text() == "data: [DONE]"
			}
			if resp.StatusCode != 200 || !done {
				errs <- fmt.Errorf("stream %d: status %d, [DONE] %t", k, resp.StatusCode, done)
			}
		}()
		time.Sleep(40 * time.Millisecond)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, tg := range gw.g.Snapshot().Routes[0].Targets {
		if n := tg.Provider.picked.Load(); n != 0 {
			t.Fatalf("%s: %d streams still counted as picked", tg.Provider.Name, n)
		}
	}
	return targets, decisions
}

// checkBounded checks that the lighter engine p1 took part of the six streams and that, in send order, no
// stream went to a target at its bound: (1 + epsilon) x its weight x the other's streams per weight + 2.
func checkBounded(t *testing.T, epsilon float64, targets, decisions []string) {
	t.Helper()
	t.Logf("targets %v, decisions %v", targets, decisions)
	var n [2]int
	weight := [2]float64{2, 1}
	for k, tg := range targets {
		i := map[string]int{"p0": 0, "p1": 1}[tg]
		other := float64(n[1-i]) / weight[1-i]
		if !math.IsInf(epsilon, 1) && float64(n[i]+1) > (1+epsilon)*weight[i]*other+2 {
			t.Fatalf("stream %d went to %s, holding %d while the other holds %d: over its bound", k, tg, n[i], n[1-i])
		}
		n[i]++
	}
	if n[1] == 0 {
		t.Fatalf("the lighter engine got none of the six streams: %v", targets)
	}
}

// TestLoadBoundSixStreams: weights 2 : 1, six concurrent long streams of one prompt. Without a bound,
// pipeline's cache and weight terms outbid the idle lighter engine at any load and every stream goes to
// the heavier one; with its default bound the lighter engine takes the streams beyond the heavier one's
// bound. cache_aware's own overload rule spills too, and with a load_bound it is weighted; consistent_hash
// spills with its epsilon.
func TestLoadBoundSixStreams(t *testing.T) {
	engines := boundFleet(t, nil)
	t.Run("pipeline without bound herds", func(t *testing.T) {
		gw := startGateway(t, boundConfig("pipeline", "load_bound = 0", engines, nil))
		targets, _ := sixStreams(t, gw)
		for _, tg := range targets {
			if tg != "p0" {
				t.Fatalf("the unbounded pipeline sent a stream to the lighter engine: %v", targets)
			}
		}
		t.Logf("without a bound every stream went to the heavier engine: %v", targets)
	})
	for _, c := range []struct {
		strategy, params string
		epsilon          float64
	}{
		{"pipeline", "", 8},
		{"cache_aware", "load_bound = 1", 1},
		{"cache_aware", "", math.Inf(1)},
		{"consistent_hash", "", 0.25},
	} {
		t.Run(c.strategy+" "+c.params, func(t *testing.T) {
			gw := startGateway(t, boundConfig(c.strategy, c.params, engines, nil))
			targets, decisions := sixStreams(t, gw)
			checkBounded(t, c.epsilon, targets, decisions)
		})
	}
}
