package engine

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/sim"
)

// The tests of this file route adapter requests to simulated vLLM engines over loopback: the engines'
// own /v1/models, vllm:lora_requests_info, adapter slots and runtime load API, no fakes.

// loraSims starts one simulated engine serving LoRA per entry of modules, with those adapters registered
// at start (path /loras/<name>); tweak, when set, adjusts engine i's config before it starts.
func loraSims(t *testing.T, modules [][]string, tweak func(i int, c *sim.Config)) ([]*sim.Engine, []string) {
	t.Helper()
	var engines []*sim.Engine
	var urls []string
	for i, mods := range modules {
		cfg := sim.DefaultConfig()
		cfg.EngineLabel = fmt.Sprint(i)
		cfg.EnableLoRA = true
		cfg.LoRALoadDelay = 10 * time.Millisecond
		for _, m := range mods {
			cfg.LoRAModules = append(cfg.LoRAModules, sim.LoRAModule{Name: m, Path: "/loras/" + m})
		}
		if tweak != nil {
			tweak(i, &cfg)
		}
		e, err := sim.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Stop)
		engines = append(engines, e)
		urls = append(urls, e.URL())
	}
	return engines, urls
}

// simLoRAConfig is loraConfig over simulated engines (base model sim-model), with extra appended.
func simLoRAConfig(strategy string, urls []string, nAdapters int, lora, extra string) string {
	perm := make([]int, len(urls))
	for i := range perm {
		perm[i] = i
	}
	return strings.ReplaceAll(loraConfig(strategy, urls, perm, nAdapters, lora), `"up-base"`, `"sim-model"`) + extra
}

// fastScrape is a [metrics_scrape] that reads the engines' /metrics and /v1/models every 50 ms.
const fastScrape = "[metrics_scrape]\nenabled = true\ninterval_secs = 0.05\ntimeout_secs = 0.5\n"

// engineCard is an adapter card of an engine's /v1/models.
type engineCard struct {
	ID     string  `json:"id"`
	Root   string  `json:"root"`
	Parent *string `json:"parent"`
}

// engineAdapters returns the adapters the engine at url lists in /v1/models (cards with a parent), sorted
// by name.
func engineAdapters(t *testing.T, url string) []engineCard {
	t.Helper()
	resp, err := testClient.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct{ Data []engineCard }
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%s/v1/models: %d %v", url, resp.StatusCode, err)
	}
	var out []engineCard
	for _, c := range list.Data {
		if c.Parent != nil {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b engineCard) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// cardNames returns the cards' ids.
func cardNames(cards []engineCard) []string {
	out := []string{}
	for _, c := range cards {
		out = append(out, c.ID)
	}
	return out
}

// targetAdapters returns what g's state shows of provider's engine adapters, on the base route "base".
func targetAdapters(t *testing.T, g *Gateway, provider string) *AdapterState {
	t.Helper()
	for _, ts := range loraRouteState(t, g, "base").Targets {
		if ts.Provider == provider {
			return ts.Adapters
		}
	}
	t.Fatalf("no target %s on route base", provider)
	return nil
}

// loraResult is the outcome of one request through the gateway.
type loraResult struct {
	status int
	target string // x-rolter-target
	body   string
	err    error
}

// sendLoRA sends one chat request for model asking for maxTokens tokens; safe in any goroutine.
func sendLoRA(gwURL, model string, maxTokens int) loraResult {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"tell me about %s"}]}`, model, maxTokens, model)
	resp, err := testClient.Post(gwURL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return loraResult{err: err}
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return loraResult{status: resp.StatusCode, target: resp.Header.Get("x-rolter-target"), body: string(b), err: err}
}

// sendLoRAConcurrently sends n requests for model at once and returns their outcomes once all are done.
func sendLoRAConcurrently(gwURL, model string, n, maxTokens int) []loraResult {
	out := make([]loraResult, n)
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = sendLoRA(gwURL, model, maxTokens)
		}()
	}
	wg.Wait()
	return out
}

// mustTarget fails unless every result is a 200 from a target in allowed, and counts them per target.
func mustTarget(t *testing.T, what string, rs []loraResult, allowed []string, counts map[string]int) {
	t.Helper()
	for _, r := range rs {
		if r.err != nil || r.status != 200 {
			t.Fatalf("%s: status %d err %v: %s", what, r.status, r.err, r.body)
		}
		if !slices.Contains(allowed, r.target) {
			t.Fatalf("%s went to %s, want one of %v", what, r.target, allowed)
		}
		counts[r.target]++
	}
}

// TestLoRAResidencyFromEngines: the gateway's view of each engine's adapters is what the engine itself
// serves - the registered ones of /v1/models, the running ones and its slots of vllm:lora_requests_info -
// and an adapter's requests go only to engines that list it.
func TestLoRAResidencyFromEngines(t *testing.T) {
	modules := [][]string{{"a0", "a1"}, {"a1"}, {"a2"}}
	maxLoRAs := []int{2, 1, 3}
	engines, urls := loraSims(t, modules, func(i int, c *sim.Config) {
		c.MaxLoRAs = maxLoRAs[i]
		c.DecodePerToken = 40 * time.Millisecond // a 20-token answer runs across many scrapes
	})
	gw := startGateway(t, simLoRAConfig("least_load", urls, 3, "", fastScrape))
	waitFor(t, 5*time.Second, "every engine's adapters and slots in the state", func() bool {
		for i := range engines {
			a := targetAdapters(t, gw.g, fmt.Sprintf("p%d", i))
			if a == nil || len(a.Registered) == 0 || a.MaxLoRA == nil {
				return false
			}
		}
		return true
	})
	for i, e := range engines {
		name := fmt.Sprintf("p%d", i)
		a := targetAdapters(t, gw.g, name)
		listed := cardNames(engineAdapters(t, e.URL()))
		if want := slices.Sorted(slices.Values(modules[i])); !slices.Equal(listed, want) {
			t.Fatalf("engine %d lists %v, started with %v", i, listed, want)
		}
		if !slices.Equal(a.Registered, listed) {
			t.Fatalf("%s: state registered %v, the engine lists %v", name, a.Registered, listed)
		}
		if *a.MaxLoRA != maxLoRAs[i] || len(a.Running) != 0 || len(a.Waiting) != 0 {
			t.Fatalf("%s idle: max_lora %d (engine's %d), running %v, waiting %v", name, *a.MaxLoRA, maxLoRAs[i], a.Running, a.Waiting)
		}
		// Every adapter route shows the same engine view for the target.
		for n := range 3 {
			for _, ts := range loraRouteState(t, gw.g, fmt.Sprintf("a%d", n)).Targets {
				if ts.Provider == name && (ts.Adapters == nil || !slices.Equal(ts.Adapters.Registered, listed)) {
					t.Fatalf("route a%d, %s: adapters %+v", n, name, ts.Adapters)
				}
			}
		}
	}

	// Slow requests of a0 (only p0 lists it) and a2 (only p2) run while the engines are scraped.
	counts := map[string]int{}
	var wg sync.WaitGroup
	var a0, a2 []loraResult
	wg.Add(2)
	go func() { defer wg.Done(); a0 = sendLoRAConcurrently(gw.URL, "a0", 3, 20) }()
	go func() { defer wg.Done(); a2 = sendLoRAConcurrently(gw.URL, "a2", 2, 20) }()
	running := func(provider, adapter string) bool {
		return slices.Contains(targetAdapters(t, gw.g, provider).Running, adapter)
	}
	waitFor(t, 5*time.Second, "a0 running on p0 and a2 on p2 in the state", func() bool { return running("p0", "a0") && running("p2", "a2") })
	for _, p := range []string{"p0", "p1", "p2"} {
		a := targetAdapters(t, gw.g, p)
		if want := map[string][]string{"p0": {"a0"}, "p1": nil, "p2": {"a2"}}[p]; !slices.Equal(a.Running, want) || len(a.Waiting) != 0 {
			t.Fatalf("%s while a0 and a2 run: running %v waiting %v, want running %v", p, a.Running, a.Waiting, want)
		}
	}
	if h := loraRouteState(t, gw.g, "a0").LoRA.Holders; !slices.Equal(h, []string{"p0"}) {
		t.Fatalf("a0 holders %v while it runs on p0", h)
	}
	wg.Wait()
	mustTarget(t, "a0", a0, []string{"p0"}, counts)
	mustTarget(t, "a2", a2, []string{"p2"}, counts)
	waitFor(t, 5*time.Second, "the running adapters to clear", func() bool {
		return len(targetAdapters(t, gw.g, "p0").Running) == 0 && len(targetAdapters(t, gw.g, "p2").Running) == 0
	})

	// a1 is on p0 and p1, never p2; sequential and concurrent requests.
	for range 4 {
		mustTarget(t, "a1", []loraResult{sendLoRA(gw.URL, "a1", 2)}, []string{"p0", "p1"}, counts)
	}
	mustTarget(t, "a1 concurrent", sendLoRAConcurrently(gw.URL, "a1", 4, 2), []string{"p0", "p1"}, counts)

	// Each engine received exactly the requests the gateway says it sent there: none went to an engine
	// lacking the adapter (it would have answered 404 and the gateway tried again elsewhere).
	for i, e := range engines {
		name := fmt.Sprintf("p%d", i)
		if st := e.Stats(); st.Requests != uint64(counts[name]) || st.Completed != st.Requests {
			t.Fatalf("%s received %d requests (%d completed), the gateway answered %d from it (%v)", name, st.Requests, st.Completed, counts[name], counts)
		}
	}
	if counts["p2"] != 2 || counts["p0"] < 3 {
		t.Fatalf("per target %v", counts)
	}
}

// TestLoRARequestsReachHolder: once an adapter is loaded on one replica, its requests - one after another
// and several at once - stay there, and a second adapter takes another replica's free slot rather than
// evicting the first: each engine loads each adapter at most once.
func TestLoRARequestsReachHolder(t *testing.T) {
	all := []string{"a0", "a1"}
	engines, urls := loraSims(t, [][]string{all, all, all, all}, func(i int, c *sim.Config) {
		c.MaxLoRAs = 1
		c.DecodePerToken = 5 * time.Millisecond
	})
	gw := startGateway(t, simLoRAConfig("least_load", urls, 2, "", fastScrape))
	waitFor(t, 5*time.Second, "the engines' adapter lists", func() bool {
		for i := range engines {
			if a := targetAdapters(t, gw.g, fmt.Sprintf("p%d", i)); a == nil || len(a.Registered) != 2 {
				return false
			}
		}
		return true
	})
	index := func(target string) int {
		for i := range engines {
			if target == fmt.Sprintf("p%d", i) {
				return i
			}
		}
		t.Fatalf("unknown target %q", target)
		return -1
	}
	counts := map[string]int{}
	first := sendLoRA(gw.URL, "a0", 4)
	mustTarget(t, "a0 first", []loraResult{first}, []string{"p0", "p1", "p2", "p3"}, counts)
	h0 := first.target
	if st := engines[index(h0)].Stats(); st.LoRALoads != 1 {
		t.Fatalf("%s loaded %d adapters for the first request", h0, st.LoRALoads)
	}
	for range 8 {
		mustTarget(t, "a0 sequential", []loraResult{sendLoRA(gw.URL, "a0", 4)}, []string{h0}, counts)
	}
	mustTarget(t, "a0 concurrent", sendLoRAConcurrently(gw.URL, "a0", 5, 4), []string{h0}, counts)
	if h := loraRouteState(t, gw.g, "a0").LoRA.Holders; !slices.Equal(h, []string{h0}) {
		t.Fatalf("a0 holders %v, want [%s]", h, h0)
	}

	// The second adapter goes where a slot is free, not into a0's only slot.
	second := sendLoRA(gw.URL, "a1", 4)
	mustTarget(t, "a1 first", []loraResult{second}, []string{"p0", "p1", "p2", "p3"}, counts)
	h1 := second.target
	if h1 == h0 {
		t.Fatalf("a1 went to %s, evicting a0 from its only slot while three engines had a free one", h1)
	}
	for range 4 {
		mustTarget(t, "a0 after a1", []loraResult{sendLoRA(gw.URL, "a0", 4)}, []string{h0}, counts)
		mustTarget(t, "a1 after a0", []loraResult{sendLoRA(gw.URL, "a1", 4)}, []string{h1}, counts)
	}
	var wg sync.WaitGroup
	var c0, c1 []loraResult
	wg.Add(2)
	go func() { defer wg.Done(); c0 = sendLoRAConcurrently(gw.URL, "a0", 4, 4) }()
	go func() { defer wg.Done(); c1 = sendLoRAConcurrently(gw.URL, "a1", 4, 4) }()
	wg.Wait()
	mustTarget(t, "a0 mixed", c0, []string{h0}, counts)
	mustTarget(t, "a1 mixed", c1, []string{h1}, counts)

	// The engines' own counters: every request on its adapter's holder, one slot load each, no eviction.
	for i, e := range engines {
		name := fmt.Sprintf("p%d", i)
		st := e.Stats()
		wantLoads := map[string]uint64{h0: 1, h1: 1}[name]
		if st.Requests != uint64(counts[name]) || st.LoRALoads != wantLoads || st.LoRAEvictions != 0 {
			t.Fatalf("%s: %d requests (gateway: %d), %d adapter loads (want %d), %d evictions", name, st.Requests, counts[name], st.LoRALoads, wantLoads, st.LoRAEvictions)
		}
	}
	if counts[h0] != 1+8+5+4+4 || counts[h1] != 1+4+4 {
		t.Fatalf("per target %v", counts)
	}
}

// TestLoRADynamicLoadSim: with dynamic_lora, a burst of requests for an adapter no engine has yet makes the
// gateway load it once, through the engine's own /v1/load_lora_adapter, on the one replica of its home set;
// every request of the burst is served there. With [metrics_scrape] the engines' lists say the adapter is
// missing until the load, and the lists read meanwhile do not undo it.
func TestLoRADynamicLoadSim(t *testing.T) {
	for _, tc := range []struct{ name, scrape string }{{"own-calls", ""}, {"scraped", fastScrape}} {
		t.Run(tc.name, func(t *testing.T) {
			engines, urls := loraSims(t, [][]string{nil, nil}, func(i int, c *sim.Config) {
				c.AllowRuntimeLoRA = true
				c.LoRALoadDelay = 200 * time.Millisecond // the burst arrives while the load runs
			})
			gw := startGateway(t, simLoRAConfig("least_load", urls, 1,
				"max_home_replicas = 1\ndynamic_lora = true\nadapter_path = \"/loras/{adapter}\"\n", tc.scrape))
			for _, e := range engines {
				if cards := engineAdapters(t, e.URL()); len(cards) != 0 {
					t.Fatalf("an engine starts with adapters %v", cards)
				}
			}
			if tc.scrape != "" {
				models := gw.g.Snapshot().Providers[0].adapters.models
				waitFor(t, 5*time.Second, "a first model list", func() bool { return models.Stats().OK > 0 })
			}
			home := loraRouteState(t, gw.g, "a0").LoRA.Home
			if len(home) != 1 {
				t.Fatalf("home set %v, want one replica", home)
			}
			counts := map[string]int{}
			mustTarget(t, "burst", sendLoRAConcurrently(gw.URL, "a0", 50, 2), home, counts)
			hi := int(home[0][1] - '0')
			he, other := engines[hi], engines[1-hi]
			if hs, ost := he.Stats(), other.Stats(); hs.LoRAAPILoads != 1 || ost.LoRAAPILoads != 0 || hs.Requests != 50 || ost.Requests != 0 {
				t.Fatalf("home engine: %d API loads, %d requests; other: %d API loads, %d requests", hs.LoRAAPILoads, hs.Requests, ost.LoRAAPILoads, ost.Requests)
			}
			// One call from the gateway, not one per request with the engine refusing the others as already
			// loaded (which the gateway counts as loads too).
			if st := loraRouteState(t, gw.g, "a0").LoRA; st.Loads != 1 || st.LoadFailures != 0 || !st.Dynamic {
				t.Fatalf("gateway load state %+v", st)
			}
			if cards := engineAdapters(t, he.URL()); len(cards) != 1 || cards[0].ID != "a0" || cards[0].Root != "/loras/a0" || *cards[0].Parent != "sim-model" {
				t.Fatalf("home engine lists %+v after the load", cards)
			}
			if cards := engineAdapters(t, other.URL()); len(cards) != 0 {
				t.Fatalf("the other engine lists %+v", cards)
			}
			if tc.scrape != "" {
				waitFor(t, 5*time.Second, "the home engine's list with a0", func() bool {
					return slices.Equal(targetAdapters(t, gw.g, home[0]).Registered, []string{"a0"})
				})
			}
			// Loaded, later requests go straight through.
			mustTarget(t, "after the load", sendLoRAConcurrently(gw.URL, "a0", 5, 2), home, counts)
			if hs, st := he.Stats(), loraRouteState(t, gw.g, "a0").LoRA; hs.LoRAAPILoads != 1 || st.Loads != 1 {
				t.Fatalf("after the load: %d API loads on the engine, %d by the gateway", hs.LoRAAPILoads, st.Loads)
			}
		})
	}
}

// slowModelList is a loopback proxy in front of a simulated engine: it reads the engine's /v1/models at
// once and delivers it delay later (a slow link or a busy engine), signalling taken when it has read
// one, and counts the /v1/load_lora_adapter calls it forwards.
type slowModelList struct {
	*fakeUpstream
	taken chan struct{}
	loads atomic.Int64
}

func newSlowModelList(t *testing.T, engineURL string, delay time.Duration) *slowModelList {
	target, err := url.Parse(engineURL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	s := &slowModelList{taken: make(chan struct{}, 64)}
	s.fakeUpstream = newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			resp, err := testClient.Get(engineURL + "/v1/models")
			if err != nil {
				w.WriteHeader(502)
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			select {
			case s.taken <- struct{}{}:
			default:
			}
			select {
			case <-time.After(delay):
			case <-r.Context().Done():
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(resp.StatusCode)
			w.Write(body) //nolint:errcheck
		case "/v1/load_lora_adapter":
			s.loads.Add(1)
			rp.ServeHTTP(w, r)
		default:
			rp.ServeHTTP(w, r)
		}
	})
	return s
}

// TestLoRADynamicLoadSlowModelList: a model list the engine produced before a dynamic load finished, but
// that reaches the gateway after it, does not make the gateway think the adapter was unloaded and load it
// again.
func TestLoRADynamicLoadSlowModelList(t *testing.T) {
	engines, urls := loraSims(t, [][]string{nil}, func(i int, c *sim.Config) {
		c.AllowRuntimeLoRA = true
		c.LoRALoadDelay = 50 * time.Millisecond
	})
	proxy := newSlowModelList(t, urls[0], 400*time.Millisecond)
	// Polls every 200 ms, each delivered 400 ms after the engine answered: a list is fresh for 600 ms.
	gw := startGateway(t, simLoRAConfig("least_load", []string{proxy.URL}, 1,
		"dynamic_lora = true\nadapter_path = \"/loras/{adapter}\"\n",
		"[metrics_scrape]\nenabled = true\ninterval_secs = 0.2\ntimeout_secs = 2\n"))
	models := gw.g.Snapshot().Providers[0].adapters.models
	waitFor(t, 5*time.Second, "a first model list", func() bool { return models.Stats().OK > 0 })
	for len(proxy.taken) > 0 {
		<-proxy.taken
	}
	// The next poll has read the engine's list, without a0; it is still on its way when a0 is loaded.
	select {
	case <-proxy.taken:
	case <-time.After(5 * time.Second):
		t.Fatal("no model list read")
	}
	polled := models.Stats().OK
	mustTarget(t, "first", []loraResult{sendLoRA(gw.URL, "a0", 2)}, []string{"p0"}, map[string]int{})
	if n := proxy.loads.Load(); n != 1 {
		t.Fatalf("%d loads for the first request", n)
	}
	waitFor(t, 5*time.Second, "the list read before the load to arrive", func() bool { return models.Stats().OK > polled })
	mustTarget(t, "second", []loraResult{sendLoRA(gw.URL, "a0", 2)}, []string{"p0"}, map[string]int{})
	if n, st := proxy.loads.Load(), loraRouteState(t, gw.g, "a0").LoRA; n != 1 || st.Loads != 1 || engines[0].Stats().LoRAAPILoads != 1 {
		t.Fatalf("%d load calls to the engine (gateway: %d loads, %d failed): a list older than the load undid it", n, st.Loads, st.LoadFailures)
	}
}
