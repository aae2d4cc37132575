package engine

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/sim"
)

// fleetConfig renders a config with one route "m" of the given strategy over the named providers of urls
// (provider name -> URL), targets in the order of names.
func fleetConfig(strategy, params string, urls map[string]string, names ...string) string {
	var b strings.Builder
	b.WriteString("[server]\nlisten = \"127.0.0.1:0\"\n")
	for _, n := range names {
		fmt.Fprintf(&b, "[[providers]]\nname = %q\napi_base = %q\n", n, urls[n])
	}
	fmt.Fprintf(&b, "[[routes]]\nmodel = \"m\"\nstrategy = %q\n", strategy)
	if params != "" {
		fmt.Fprintf(&b, "[routes.params]\n%s\n", params)
	}
	for _, n := range names {
		fmt.Fprintf(&b, "[[routes.targets]]\nprovider = %q\nmodel = \"sim-model\"\n", n)
	}
	return b.String()
}

func mustReload(t *testing.T, gw *testGateway, text string) {
	t.Helper()
	cfg, err := config.Parse([]byte(text), "reload.toml")
	if err != nil {
		t.Fatalf("bad reload config: %s", err)
	}
	if err := gw.g.Reload(cfg); err != nil {
		t.Fatalf("reload: %s", err)
	}
}

// loadResult is what a load generator saw.
type loadResult struct {
	mu       sync.Mutex
	ok, bad  int
	failures []string
	// firstOn is when each target first answered a request that was sent after since[target].
	firstOn map[string]time.Time
	since   map[string]time.Time
}

func (r *loadResult) record(target string, sent time.Time, err string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != "" {
		r.bad++
		if len(r.failures) < 10 {
			r.failures = append(r.failures, err)
		}
		return
	}
	r.ok++
	if s, ok := r.since[target]; ok && !sent.Before(s) {
		if _, seen := r.firstOn[target]; !seen {
			r.firstOn[target] = time.Now()
		}
	}
}

func (r *loadResult) watch(target string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	r.since[target] = now
	return now
}

// runLoad sends streaming and non-streaming requests with shared prefixes at concurrency c until stop.
func runLoad(t *testing.T, url string, c int, stop <-chan struct{}, res *loadResult) *sync.WaitGroup {
	var wg sync.WaitGroup
	system := strings.Repeat("You are a careful assistant for the fleet. ", 20)
	for w := 0; w < c; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				stream := (w+i)%2 == 0
				body := fmt.Sprintf(`{"model":"m","stream":%v,"max_tokens":12,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`,
					stream, system, (w*7+i)%40)
				sent := time.Now()
				resp, err := testClient.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					res.record("", sent, err.Error())
					continue
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case err != nil:
					res.record("", sent, "body: "+err.Error())
				case resp.StatusCode != 200:
					res.record("", sent, fmt.Sprintf("status %d: %s", resp.StatusCode, got))
				case stream && !strings.HasSuffix(string(got), "data: [DONE]\n\n"):
					res.record("", sent, "stream without [DONE]: "+string(got))
				case stream && strings.Contains(string(got), `"error"`):
					res.record("", sent, "stream error: "+string(got))
				default:
					res.record(resp.Header.Get("X-Rolter-Target"), sent, "")
				}
			}
		}()
	}
	return &wg
}

// TestReloadUnderLoad: reloads that add a target, remove one with streams in flight to it, switch the
// route's strategy and change its threshold, under a loopback load of streaming and non-streaming requests
// at concurrency 32: no request fails, the removed target's streams complete, and the new target gets
// traffic within a second.
func TestReloadUnderLoad(t *testing.T) {
	engines, _ := simFleet(t, 3, func(c *sim.Config) { c.DecodePerToken = 3 * time.Millisecond })
	urls := map[string]string{"a": engines[0].URL(), "b": engines[1].URL(), "c": engines[2].URL()}
	gw := startGateway(t, fleetConfig("cache_aware", "", urls, "a", "b"))
	res := &loadResult{firstOn: map[string]time.Time{}, since: map[string]time.Time{}}
	stop := make(chan struct{})
	wg := runLoad(t, gw.URL, 32, stop, res)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()

	time.Sleep(500 * time.Millisecond)
	added := res.watch("c")
	mustReload(t, gw, fleetConfig("cache_aware", "", urls, "a", "b", "c"))
	time.Sleep(700 * time.Millisecond)
	// "a" has streams in flight now (3 ms per token, 12 tokens); remove it.
	mustReload(t, gw, fleetConfig("cache_aware", "", urls, "b", "c"))
	time.Sleep(500 * time.Millisecond)
	mustReload(t, gw, fleetConfig("pipeline", "", urls, "b", "c"))
	time.Sleep(500 * time.Millisecond)
	mustReload(t, gw, fleetConfig("cache_aware", "threshold = 0.3", urls, "b", "c"))
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()

	res.mu.Lock()
	defer res.mu.Unlock()
	t.Logf("%d requests ok, %d failed across 4 reloads", res.ok, res.bad)
	if res.bad != 0 || res.ok < 200 {
		t.Fatalf("%d failed requests (%d ok), first failures: %q", res.bad, res.ok, res.failures)
	}
	first, ok := res.firstOn["c"]
	if !ok {
		t.Fatal("the added target never answered")
	}
	if d := first.Sub(added); d > time.Second {
		t.Fatalf("the added target answered its first request %s after the reload, want within 1s", d)
	}
	if gw.g.Snapshot().Generation() != 5 {
		t.Fatalf("generation %d after 4 reloads, want 5", gw.g.Snapshot().Generation())
	}
}

// TestReloadKeepsRoutingMemory: right after a reload that leaves a target in place (another target added,
// the threshold changed), a repeated prompt is still a prefix_hit there.
func TestReloadKeepsRoutingMemory(t *testing.T) {
	_, list := simFleet(t, 3, nil)
	urls := map[string]string{"a": list[0], "b": list[1], "c": list[2]}
	gw := startGateway(t, fleetConfig("cache_aware", "", urls, "a", "b"))
	body := chatBody("m", strings.Repeat("a long shared question about the fleet ", 30), false)
	resp, _ := post(t, gw.URL+"/v1/chat/completions", body)
	home := resp.Header.Get("X-Rolter-Target")
	for _, next := range []string{
		fleetConfig("cache_aware", "", urls, "a", "b", "c"),
		fleetConfig("cache_aware", "threshold = 0.4", urls, "c", "b", "a"),
		fleetConfig("pipeline", "", urls, "a", "b", "c"),
	} {
		mustReload(t, gw, next)
		resp, got := post(t, gw.URL+"/v1/chat/completions", body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, got)
		}
		dec := resp.Header.Get("X-Rolter-Decision")
		if target := resp.Header.Get("X-Rolter-Target"); target != home || (dec != "prefix_hit" && dec != "score") {
			t.Fatalf("after a reload the repeated prompt went to %s (%s), want %s (prefix_hit): the trie was not kept", target, dec, home)
		}
		if dec == "score" && resp.Header.Get("X-Rolter-Prefix-Match") != "1.0000" {
			t.Fatalf("pipeline scored the kept prompt %s, want a full match", resp.Header.Get("X-Rolter-Prefix-Match"))
		}
	}
}

// TestReloadKeepsProviderState: a provider whose settings did not change keeps its very object - pool,
// health, counters - and one whose api_base changed is replaced.
func TestReloadKeepsProviderState(t *testing.T) {
	up1, up2 := newFakeUpstream(t, okJSON), newFakeUpstream(t, okJSON)
	urls := map[string]string{"a": up1.URL, "b": up2.URL}
	gw := startGateway(t, fleetConfig("round_robin", "", urls, "a", "b"))
	before := gw.g.Snapshot()
	mustReload(t, gw, fleetConfig("least_load", "", urls, "a", "b"))
	after := gw.g.Snapshot()
	if after.providers["a"] != before.providers["a"] || after.providers["b"] != before.providers["b"] {
		t.Fatal("unchanged providers were rebuilt")
	}
	urls["b"] = up1.URL
	mustReload(t, gw, fleetConfig("least_load", "", urls, "a", "b"))
	if gw.g.Snapshot().providers["b"] == after.providers["b"] || gw.g.Snapshot().providers["a"] != after.providers["a"] {
		t.Fatal("a provider whose api_base changed must be replaced, the other kept")
	}
}

// TestReloadRefusesBadConfig: a broken file or a change that needs a restart changes nothing and says why.
func TestReloadRefusesBadConfig(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	text := gatewayConfig("round_robin", "", up.URL)
	gw := startGateway(t, text)
	dir := t.TempDir()
	path := filepath.Join(dir, "rolter.toml")
	if err := os.WriteFile(path, []byte(strings.Replace(text, `strategy = "round_robin"`, `strategy = "nope"`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	gen := gw.g.Snapshot().Generation()
	err := gw.g.ReloadFile(path)
	if err == nil || !strings.Contains(err.Error(), "rolter.toml:") || !strings.Contains(err.Error(), `unknown strategy "nope"`) {
		t.Fatalf("reload of a bad file: %v", err)
	}
	restart := strings.Replace(text, `listen = "127.0.0.1:0"`, `listen = "127.0.0.1:1"`, 1)
	cfg, err := config.Parse([]byte(restart), "r.toml")
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.g.Reload(cfg); err == nil || !strings.Contains(err.Error(), "server.listen") {
		t.Fatalf("reload changing server.listen: %v", err)
	}
	cluster := strings.Replace(text, "[server]\n", "[cluster]\nnats_url = \"nats://127.0.0.1:4222\"\n[server]\n", 1)
	if cfg, err = config.Parse([]byte(cluster), "c.toml"); err != nil {
		t.Fatal(err)
	}
	if err := gw.g.Reload(cfg); err == nil || !strings.Contains(err.Error(), "[cluster] changed") {
		t.Fatalf("reload adding [cluster]: %v", err)
	}
	control := strings.Replace(text, "[server]\n", "[control]\nenabled = false\nhosts = [\"gw.example\"]\n[server]\n", 1)
	if cfg, err = config.Parse([]byte(control), "ctl.toml"); err != nil {
		t.Fatal(err)
	}
	if err := gw.g.Reload(cfg); err == nil || !strings.Contains(err.Error(), "[control] changed") {
		t.Fatalf("reload changing [control] hosts: %v", err)
	}
	if g := gw.g.Snapshot().Generation(); g != gen {
		t.Fatalf("generation %d after refused reloads, want %d", g, gen)
	}
	if resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false)); resp.StatusCode != 200 {
		t.Fatalf("after refused reloads: %d %s", resp.StatusCode, got)
	}
	m := metricsText(t, gw)
	if !strings.Contains(m, `rolter_config_reloads_total{result="failed"} 4`) {
		t.Fatalf("/metrics does not count the four refused reloads:\n%s", grepLines(m, "rolter_config"))
	}
}

// TestManyReloads: 200 reloads in a row - adding and removing a target, switching strategies - leave
// goroutines and heap where they were, and no metric series of a removed target.
func TestManyReloads(t *testing.T) {
	ups := []*fakeUpstream{newFakeUpstream(t, okJSON), newFakeUpstream(t, okJSON), newFakeUpstream(t, okJSON)}
	urls := map[string]string{"a": ups[0].URL, "b": ups[1].URL, "c": ups[2].URL}
	gw := startGateway(t, fleetConfig("pipeline", "", urls, "a", "b"))
	configs := []string{
		fleetConfig("pipeline", "", urls, "a", "b", "c"),
		fleetConfig("cache_aware", "", urls, "a", "c"),
		fleetConfig("round_robin", "", urls, "b", "c"),
		fleetConfig("pipeline", "", urls, "a", "b"),
	}
	post(t, gw.URL+"/v1/chat/completions", chatBody("m", "warm", false))
	waitSettled(t, gw)
	goroutines, heap := runtime.NumGoroutine(), heapInUse()
	for i := 0; i < 200; i++ {
		mustReload(t, gw, configs[i%len(configs)])
		if i%10 == 0 {
			post(t, gw.URL+"/v1/chat/completions", chatBody("m", fmt.Sprint("q", i), false))
		}
	}
	waitSettled(t, gw)
	waitFor(t, 5*time.Second, "goroutines back to the baseline", func() bool { return runtime.NumGoroutine() <= goroutines+2 })
	if grew := heapInUse() - heap; grew > 8<<20 {
		t.Fatalf("heap grew %d KiB over 200 reloads", grew>>10)
	}
	// The last config has targets a and b: nothing of c may be left.
	m := metricsText(t, gw)
	if strings.Contains(m, `target="c"`) {
		t.Fatalf("series of the removed target c are still exported:\n%s", grepLines(m, `target="c"`))
	}
	if !strings.Contains(m, `target="a"`) {
		t.Fatal("no series of the live target a")
	}
	// Families are written once each, however many provider and target sets hold their series.
	types := map[string]int{}
	for _, l := range strings.Split(m, "\n") {
		if strings.HasPrefix(l, "# TYPE ") {
			types[strings.Fields(l)[2]]++
		}
	}
	for fam, n := range types {
		if n > 1 {
			t.Fatalf("%d TYPE lines for %s", n, fam)
		}
	}
	if n := len(gw.g.series); n != 3 {
		t.Fatalf("%d route and target series kept, want 3 (route m, targets a and b)", n)
	}
}

// waitSettled waits until no replaced snapshot is still retiring.
func waitSettled(t *testing.T, gw *testGateway) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		gw.g.retiring.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("replaced snapshots did not retire")
	}
}

func metricsText(t *testing.T, gw *testGateway) string {
	t.Helper()
	resp, err := testClient.Get(gw.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func grepLines(text, substr string) string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		if strings.Contains(sc.Text(), substr) {
			out = append(out, sc.Text())
		}
	}
	return strings.Join(out, "\n")
}
