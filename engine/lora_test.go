package engine

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// loraConfig renders a config with route "base" over the upstream URLs (providers p<i>, listed in the order
// of perm), serving adapters a0..a<n-1> with the [routes.lora] keys in lora.
func loraConfig(strategy string, urls []string, perm []int, nAdapters int, lora string) string {
	var b strings.Builder
	b.WriteString("[server]\nlisten = \"127.0.0.1:0\"\n")
	for _, i := range perm {
		fmt.Fprintf(&b, "[[providers]]\nname = \"p%d\"\napi_base = %q\n", i, urls[i])
	}
	fmt.Fprintf(&b, "[[routes]]\nmodel = \"base\"\nstrategy = %q\n", strategy)
	for _, i := range perm {
		fmt.Fprintf(&b, "[[routes.targets]]\nprovider = \"p%d\"\nmodel = \"up-base\"\n", i)
	}
	var names []string
	for a := range nAdapters {
		names = append(names, fmt.Sprintf("%q", fmt.Sprintf("a%d", a)))
	}
	fmt.Fprintf(&b, "[routes.lora]\nadapters = [%s]\n%s\n", strings.Join(names, ", "), lora)
	return b.String()
}

// loraRouteState returns the state of adapter route model on g.
func loraRouteState(t *testing.T, g *Gateway, model string) RouteState {
	t.Helper()
	for _, rs := range g.State().Routes {
		if rs.Model == model {
			return rs
		}
	}
	t.Fatalf("no route %q in the state", model)
	return RouteState{}
}

// blockedOK answers a chat completion once release is closed.
func blockedOK(release <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		okJSON(w, r)
	}
}

func TestLoRAHomeSetSameOnTwoGateways(t *testing.T) {
	var urls []string
	for range 6 {
		urls = append(urls, newFakeUpstream(t, okJSON).URL)
	}
	lora := "home_replicas = 2\nmax_home_replicas = 3\n"
	a := startGateway(t, loraConfig("least_load", urls, []int{0, 1, 2, 3, 4, 5}, 8, lora))
	b := startGateway(t, loraConfig("least_load", urls, []int{5, 3, 1, 0, 4, 2}, 8, lora))
	// Before any traffic, both gateways give every adapter the same order and the same home set.
	firsts := map[string]bool{}
	for n := range 8 {
		model := fmt.Sprintf("a%d", n)
		sa, sb := loraRouteState(t, a.g, model).LoRA, loraRouteState(t, b.g, model).LoRA
		if sa == nil || sb == nil {
			t.Fatalf("%s: no lora state", model)
		}
		if !slices.Equal(sa.Order, sb.Order) || !slices.Equal(sa.Home, sb.Home) {
			t.Fatalf("%s: gateways disagree: order %v home %v, and order %v home %v", model, sa.Order, sa.Home, sb.Order, sb.Home)
		}
		if sa.K != 2 || !slices.Equal(sa.Home, sa.Order[:2]) || sa.Base != "base" || sa.Adapter != model {
			t.Fatalf("%s: state %+v", model, sa)
		}
		firsts[sa.Order[0]] = true
	}
	// Requests of an adapter, through either gateway, land in the home set it shows, and stay on the
	// replicas that hold the adapter: they are the set's first members from then on.
	for n := range 8 {
		model := fmt.Sprintf("a%d", n)
		for _, g := range []*testGateway{a, b} {
			for range 4 {
				home := loraRouteState(t, g.g, model).LoRA.Home
				resp, body := post(t, g.URL+"/v1/chat/completions", chatBody(model, "hello", false))
				if resp.StatusCode != 200 {
					t.Fatalf("%s: %d %s", model, resp.StatusCode, body)
				}
				if got := resp.Header.Get("x-rolter-target"); !slices.Contains(home, got) {
					t.Fatalf("%s went to %s, not its home set %v", model, got, home)
				}
			}
			if st := loraRouteState(t, g.g, model).LoRA; len(st.Holders) == 0 || !slices.Contains(st.Home, st.Holders[0]) {
				t.Fatalf("%s: holders %v outside the home set %v", model, st.Holders, st.Home)
			}
		}
	}
	if len(firsts) < 3 {
		t.Fatalf("8 adapters share %d first replicas out of 6: %v", len(firsts), firsts)
	}
}

func TestLoRAAdapterIsAModel(t *testing.T) {
	var seen atomic.Value
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		var b strings.Builder
		buf := make([]byte, 4096)
		n, _ := r.Body.Read(buf)
		b.Write(buf[:n])
		seen.Store(b.String())
		okJSON(w, r)
	})
	g := startGateway(t, loraConfig("cache_aware", []string{up.URL}, []int{0}, 2, ""))
	resp, body := post(t, g.URL+"/v1/chat/completions", chatBody("a1", "hi", false))
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if s, _ := seen.Load().(string); !strings.Contains(s, `"model":"a1"`) {
		t.Fatalf("upstream got %s, want the adapter's name as the model", s)
	}
	resp, body = post(t, g.URL+"/v1/chat/completions", chatBody("base", "hi", false))
	if s, _ := seen.Load().(string); resp.StatusCode != 200 || !strings.Contains(s, `"model":"up-base"`) {
		t.Fatalf("base: %d %s, upstream got %s", resp.StatusCode, body, s)
	}
	resp, err := testClient.Get(g.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	models, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{`"id":"base"`, `"id":"a0"`, `"id":"a1"`} {
		if !strings.Contains(string(models), m) {
			t.Fatalf("/v1/models (%d) lacks %s: %s", resp.StatusCode, m, models)
		}
	}
}

func TestLoRAHomeSetGrowsAndShrinks(t *testing.T) {
	release := make(chan struct{})
	var urls []string
	for range 4 {
		urls = append(urls, newFakeUpstream(t, blockedOK(release)).URL)
	}
	g := startGateway(t, loraConfig("least_load", urls, []int{0, 1, 2, 3}, 1,
		"home_replicas = 1\nmax_home_replicas = 4\nreplica_requests = 2\ncool_secs = 0.3\n"))
	st := loraRouteState(t, g.g, "a0").LoRA
	if st.K != 1 {
		t.Fatalf("idle home set width %d, want 1", st.K)
	}
	// Seven requests in flight need ceil(7/2) = 4 replicas; one replica alone would take them all.
	var wg sync.WaitGroup
	var mu sync.Mutex
	targets := map[string]int{}
	for range 7 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := testClient.Post(g.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("a0", "x", false)))
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			mu.Lock()
			targets[resp.Header.Get("x-rolter-target")]++
			mu.Unlock()
		}()
		time.Sleep(20 * time.Millisecond) // each request is in flight before the next is picked
	}
	waitFor(t, 5*time.Second, "7 requests in flight", func() bool { return loraRouteState(t, g.g, "a0").LoRA.Inflight == 7 })
	st = loraRouteState(t, g.g, "a0").LoRA
	if st.K != 4 {
		t.Fatalf("home set width %d with 7 requests in flight at 2 per replica, want 4", st.K)
	}
	close(release)
	wg.Wait()
	if len(targets) < 3 {
		t.Fatalf("7 concurrent requests went to %d replicas: %v", len(targets), targets)
	}
	// Cooled, the set shrinks one replica per cool_secs, down to home_replicas.
	waitFor(t, 10*time.Second, "the home set to shrink to 1", func() bool { return loraRouteState(t, g.g, "a0").LoRA.K == 1 })
	for range 5 {
		resp, body := post(t, g.URL+"/v1/chat/completions", chatBody("a0", "x", false))
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	if st = loraRouteState(t, g.g, "a0").LoRA; st.K != 1 || len(st.Home) != 1 {
		t.Fatalf("after cooling: %+v", st)
	}
}

// loadingEngine is a fake vLLM engine with runtime LoRA updating: it counts /v1/load_lora_adapter calls,
// answering each after delay with status (200: vLLM's success text), and serves chat completions.
type loadingEngine struct {
	*fakeUpstream
	loads  atomic.Int64
	bodies chan string
}

func newLoadingEngine(t *testing.T, delay time.Duration, status int) *loadingEngine {
	e := &loadingEngine{bodies: make(chan string, 64)}
	e.fakeUpstream = newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/load_lora_adapter" {
			okJSON(w, r)
			return
		}
		e.loads.Add(1)
		b, _ := io.ReadAll(r.Body)
		select {
		case e.bodies <- string(b):
		default:
		}
		time.Sleep(delay)
		w.WriteHeader(status)
		if status == 200 {
			fmt.Fprint(w, "Success: LoRA adapter 'a0' added successfully.")
		} else {
			fmt.Fprint(w, `{"error":{"message":"No adapter found for /loras/a0","type":"NotFoundError","code":404}}`)
		}
	})
	return e
}

func TestLoRADynamicLoadOnceUnderBurst(t *testing.T) {
	engines := []*loadingEngine{newLoadingEngine(t, 200*time.Millisecond, 200), newLoadingEngine(t, 200*time.Millisecond, 200)}
	g := startGateway(t, loraConfig("cache_aware", []string{engines[0].URL, engines[1].URL}, []int{0, 1}, 1,
		"max_home_replicas = 1\ndynamic_lora = true\nadapter_path = \"/loras/{adapter}\"\n"))
	home := loraRouteState(t, g.g, "a0").LoRA.Home[0]
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := testClient.Post(g.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("a0", "burst", false)))
			if err != nil || resp.StatusCode != 200 || resp.Header.Get("x-rolter-target") != home {
				failed.Add(1)
			}
			if err == nil {
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of 50 requests failed or left the home set %s", n, home)
	}
	i := int(home[1] - '0')
	if a, b := engines[i].loads.Load(), engines[1-i].loads.Load(); a != 1 || b != 0 {
		t.Fatalf("loads: home %d, other %d; want 1 and 0", a, b)
	}
	if body := <-engines[i].bodies; body != `{"lora_name":"a0","lora_path":"/loras/a0"}` {
		t.Fatalf("load request %s", body)
	}
	st := loraRouteState(t, g.g, "a0").LoRA
	if st.Loads != 1 || st.LoadFailures != 0 || !st.Dynamic {
		t.Fatalf("state %+v", st)
	}
	// Loaded, later requests go straight through.
	resp, _ := post(t, g.URL+"/v1/chat/completions", chatBody("a0", "again", false))
	if resp.StatusCode != 200 || engines[i].loads.Load() != 1 {
		t.Fatalf("after the load: %d, %d loads", resp.StatusCode, engines[i].loads.Load())
	}
}

func TestLoRADynamicLoadFails(t *testing.T) {
	e := newLoadingEngine(t, 0, 404)
	g := startGateway(t, loraConfig("round_robin", []string{e.URL}, []int{0}, 1,
		"dynamic_lora = true\nadapter_path = \"/loras/{adapter}\"\n"))
	resp, body := post(t, g.URL+"/v1/chat/completions", chatBody("a0", "x", false))
	if resp.StatusCode != 502 || !strings.Contains(body, "cannot load adapter a0 on p0: HTTP 404") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	// The engine's other models are not affected: no cooldown.
	resp, body = post(t, g.URL+"/v1/chat/completions", chatBody("base", "x", false))
	if resp.StatusCode != 200 {
		t.Fatalf("base after a failed load: %d %s", resp.StatusCode, body)
	}
	if st := loraRouteState(t, g.g, "a0").LoRA; st.LoadFailures != 1 || st.Loads != 0 {
		t.Fatalf("state %+v", st)
	}
}

// TestLoRAPlacementDisplacesTheColdest: an adapter no replica holds goes where it displaces the least - a
// free slot, else the idle adapter of the lowest request rate, never one whose requests are running - as
// long as the replica is among the adapter's first max_home_replicas, whatever its rendezvous order.
func TestLoRAPlacementDisplacesTheColdest(t *testing.T) {
	release := make(chan struct{})
	handler := func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if strings.Contains(string(b), "hold") {
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		okJSON(w, r)
	}
	urls := []string{newFakeUpstream(t, handler).URL, newFakeUpstream(t, handler).URL}
	g := startGateway(t, loraConfig("least_load", urls, []int{0, 1}, 4, "max_loras = 1\nmax_home_replicas = 2\n"))
	send := func(adapter, text string) string {
		t.Helper()
		resp, body := post(t, g.URL+"/v1/chat/completions", chatBody(adapter, text, false))
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", adapter, resp.StatusCode, body)
		}
		return resp.Header.Get("x-rolter-target")
	}
	hot := send("a0", "x")
	for range 9 {
		if got := send("a0", "x"); got != hot {
			t.Fatalf("a0 held on %s went to %s", hot, got)
		}
	}
	cold := send("a1", "x") // the other replica's slot is free
	if cold == hot {
		t.Fatalf("a1 displaced a0 on %s with a free slot on the other replica", hot)
	}
	// Each replica's one slot holds an idle adapter: a2 displaces a1 (one request) rather than a0 (ten).
	if got := send("a2", "x"); got != cold {
		t.Fatalf("a2 went to %s, displacing a0 of ten requests, not a1 of one on %s", got, cold)
	}
	// With a request of a2 running on that replica its slot is taken: a3 displaces a0 instead.
	done := make(chan string, 1)
	go func() {
		resp, err := testClient.Post(g.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("a2", "hold", false)))
		if err != nil {
			done <- err.Error()
			return
		}
		resp.Body.Close()
		done <- resp.Header.Get("x-rolter-target")
	}()
	waitFor(t, 5*time.Second, "a2's request in flight", func() bool { return loraRouteState(t, g.g, "a2").LoRA.Inflight == 1 })
	if got := send("a3", "x"); got != hot {
		t.Fatalf("a3 went to %s, where a2's request runs, not to %s", got, hot)
	}
	close(release)
	if got := <-done; got != cold {
		t.Fatalf("the held a2 request: %s", got)
	}
}
