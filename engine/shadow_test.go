package engine

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
)

func TestShadowConfig(t *testing.T) {
	f := func(shadow, want string) {
		t.Helper()
		_, err := config.Parse([]byte(gatewayConfig("round_robin", "[routes.shadow]\nstrategies = "+shadow+"\n", "http://127.0.0.1:1", "http://127.0.0.1:2")), "t.toml")
		if want == "" {
			if err != nil {
				t.Fatalf("%s: %v", shadow, err)
			}
			return
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: got %v, want %q", shadow, err, want)
		}
	}
	f(`["cache_aware", "pipeline"]`, "")
	f(`["nope"]`, `routes[0].shadow.strategies[0]: unknown strategy "nope"`)
	f(`["round_robin"]`, `routes[0].shadow.strategies[0]: "round_robin" is the route's own strategy`)
	f(`["pipeline", "pipeline"]`, `routes[0].shadow.strategies[1]: "pipeline" is listed twice`)
	f(`["cache_aware", "pipeline", "random", "weighted", "least_load"]`, "at most 4 shadow strategies")
	f(`["precise_cache_aware"]`, `strategy "precise_cache_aware" needs [providers.kv_events] on provider "p0"`)
}

// shadowCounter reads rolter_shadow_<name>{route="m",shadow=...}.
func shadowCounter(text, name, shadow string) float64 {
	return metricValue(text, fmt.Sprintf(`rolter_shadow_%s{route="m",shadow=%q}`, name, shadow))
}

// TestShadowStrategies: shadows rank every request against their own state, without moving traffic.
func TestShadowStrategies(t *testing.T) {
	var ups []string
	for range 4 {
		ups = append(ups, newFakeUpstream(t, okJSON).URL)
	}
	gw := startGateway(t, gatewayConfig("round_robin", "[routes.shadow]\nstrategies = [\"cache_aware\", \"pipeline\"]\n", ups...))
	const n = 40
	targets := map[string]int{}
	for i := range n {
		prompt := strings.Repeat(fmt.Sprintf("group %d shares this long system prompt. ", i%4), 20) + fmt.Sprint(" question ", i)
		resp, body := post(t, gw.URL+"/v1/chat/completions", chatBody("m", prompt, false))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		targets[resp.Header.Get("X-Rolter-Target")]++
	}
	// The live strategy kept routing round robin.
	for _, c := range targets {
		if c != n/4 {
			t.Fatalf("live targets %v: shadows moved traffic", targets)
		}
	}
	var text string
	waitFor(t, 5*time.Second, "the shadows to rank and end every request", func() bool {
		_, text = getMetrics(t, gw)
		return shadowCounter(text, "succeeded_total", "cache_aware") == n && shadowCounter(text, "succeeded_total", "pipeline") == n
	})
	for _, sh := range []string{"cache_aware", "pipeline"} {
		ranked, agreed := shadowCounter(text, "ranked_total", sh), shadowCounter(text, "agreed_total", sh)
		scored, held, captured := shadowCounter(text, "reuse_scored_total", sh), shadowCounter(text, "reuse_held_total", sh), shadowCounter(text, "reuse_captured_total", sh)
		if ranked != n || agreed < 0 || agreed > n {
			t.Errorf("%s: ranked %v agreed %v", sh, ranked, agreed)
		}
		if !(held >= captured && captured > 0 && scored >= held) {
			t.Errorf("%s: scored %v held %v captured %v; want scored >= held >= captured > 0", sh, scored, held, captured)
		}
		if cov := shadowCounter(text, "load_cov", sh); cov < 0 {
			t.Errorf("%s: no load spread gauge", sh)
		}
	}
	// cache_aware in its own state sends each group to the target that holds its prefix: after the first
	// request of a group, it captures most of every prompt.
	if c, s := shadowCounter(text, "reuse_captured_total", "cache_aware"), shadowCounter(text, "reuse_scored_total", "cache_aware"); c/s < 0.7 {
		t.Errorf("cache_aware shadow captured %.2f of the prompt bytes; want most of them", c/s)
	}
	if d := metricValue(text, `rolter_shadow_dropped_total{route="m"}`); d != 0 {
		t.Errorf("%v shadow runs dropped at 40 sequential requests", d)
	}
	if s := metricValue(text, `rolter_reuse_scored_total{route="m",target="p0"}`); s > 0 {
		t.Errorf("round_robin live route scored %v: predicted reuse is the shadows' only", s)
	}
}

// slowStrategy is a shadow that takes far longer than a request.
type slowStrategy struct{ d time.Duration }

func (s slowStrategy) Rank(p *Pick, out []int) (int, Decision) {
	time.Sleep(s.d)
	out[0] = p.Eligible[0]
	return 1, decide(ReasonRoundRobin)
}

// TestShadowSlowNeverDelays: a shadow slower than the traffic drops and counts what it
// cannot keep up with, and the live requests take no longer than without it.
func TestShadowSlowNeverDelays(t *testing.T) {
	config.Strategies["slow_test"] = config.StrategySpec{}
	strategies["slow_test"] = func(*Route, config.RouteParams, *buildEnv) (Strategy, error) {
		return slowStrategy{20 * time.Millisecond}, nil
	}
	t.Cleanup(func() { delete(strategies, "slow_test"); delete(config.Strategies, "slow_test") })
	up := newFakeUpstream(t, okJSON)
	run := func(extra string) (time.Duration, string) {
		gw := startGateway(t, gatewayConfig("round_robin", extra, up.URL))
		body := chatBody("m", strings.Repeat("a prompt to copy ", 200), false)
		post(t, gw.URL+"/v1/chat/completions", body) // warm the connections
		start := time.Now()
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 60 {
					if resp, got := post(t, gw.URL+"/v1/chat/completions", body); resp.StatusCode != 200 {
						t.Errorf("status %d: %s", resp.StatusCode, got)
						return
					}
				}
			}()
		}
		wg.Wait()
		d := time.Since(start)
		_, text := getMetrics(t, gw)
		return d, text
	}
	without, _ := run("")
	with, text := run("[routes.shadow]\nstrategies = [\"slow_test\"]\n")
	if d := metricValue(text, `rolter_shadow_dropped_total{route="m"}`); d <= 0 {
		t.Errorf("a shadow at 20 ms per request dropped nothing of 480 requests")
	}
	// Were the shadow on the request path, 480 requests over 8 clients would take 60 x 20 ms = 1.2 s more.
	if with > 3*without+300*time.Millisecond {
		t.Fatalf("480 requests took %v with a slow shadow, %v without", with, without)
	}
	t.Logf("480 requests: %v without shadows, %v with a 20 ms shadow; %v shadow runs dropped", without, with,
		metricValue(text, `rolter_shadow_dropped_total{route="m"}`))
}

// TestShadowTriesTakeTheShare: a shadow strategy's tries are sized by the share trieShare counts them in,
// not by the strategy's own default (256 MiB each).
func TestShadowTriesTakeTheShare(t *testing.T) {
	cfg, err := config.Parse([]byte(gatewayConfig("round_robin", "[routes.shadow]\nstrategies = [\"cache_aware\"]\n",
		"http://127.0.0.1:1", "http://127.0.0.1:2")), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(cfg, Options{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Shutdown(contextDone())
	_, bytes := cfg.TrieShare()
	sh := g.snap.Load().routes["m"].shadows.shadows[0]
	h, ok := sh.strategy.(trieHolder)
	if !ok {
		t.Fatalf("shadow %T keeps no tries", sh.strategy)
	}
	for i, tr := range h.triesOf() {
		if _, got := tr.Limits(); got != bytes {
			t.Fatalf("shadow trie %d: ceiling %d bytes, want the share %d", i, got, bytes)
		}
	}
}
