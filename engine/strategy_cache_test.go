package engine

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/sim"
)

func cacheRoute(t testing.TB, n int, params string) (*Route, *cacheAware) {
	t.Helper()
	w := make([]float64, n)
	for i := range w {
		w[i] = 1
	}
	r := testRoute(t, "cache_aware", w, params)
	return r, r.Strategy.(*cacheAware)
}

func rank(r *Route, p *Pick) (int, Decision) {
	var out [maxTargets]int
	_, d := r.Strategy.Rank(p, out[:])
	return out[0], d
}

// TestCacheAwareRules pins the documented rule on the strategy itself (home = false: the seed's rule for a
// request nothing clears the threshold for; TestCacheAwareHome pins the home).
func TestCacheAwareRules(t *testing.T) {
	r, s := cacheRoute(t, 3, "home = false")
	var buf [maxTargets]int
	var p Pick
	allEligible(r, &p, buf[:])
	load := func(l0, l1, l2 int64) {
		r.Targets[0].Provider.inflight.Store(l0)
		r.Targets[1].Provider.inflight.Store(l1)
		r.Targets[2].Provider.inflight.Store(l2)
	}
	key := func(s string) { p.Key = []byte(s) }
	f := func(wantTarget int, wantReason Reason, wantScore float64) {
		t.Helper()
		got, d := rank(r, &p)
		if got != wantTarget || d.Reason != wantReason || (wantScore >= 0 && (d.Score < wantScore-1e-9 || d.Score > wantScore+1e-9)) {
			t.Fatalf("got target %d %s score %.3f; want %d %s %.3f", got, d.Reason, d.Score, wantTarget, wantReason, wantScore)
		}
	}
	s.tries[1].Insert([]byte("0123456789"))
	s.tries[2].Insert([]byte("zz"))

	key("0123456789")
	f(1, ReasonPrefixHit, 1)
	key("01234abcde") // exactly half cached: >= threshold pins
	f(1, ReasonPrefixHit, 0.5)
	key("0123abcdef") // 0.4: below threshold -> least load
	load(3, 0, 5)
	f(1, ReasonNoMatch, 0.4)
	load(0, 5, 5)
	f(0, ReasonNoMatch, 0.4)

	// Overloaded = load > min+2 AND load > 1.5*min.
	key("0123456789")
	load(0, 2, 9)
	f(1, ReasonPrefixHit, 1) // 2 > 0+2 is false
	load(0, 3, 9)
	f(0, ReasonOverloaded, 1) // 3 > 2 and 3 > 0
	load(10, 14, 10)
	f(1, ReasonPrefixHit, 1) // 14 > 12 but 14 > 15 is false
	load(10, 16, 12)
	f(0, ReasonOverloaded, 1) // 16 > 12 and 16 > 15

	// The best holder overloaded but a second holder that clears the threshold is not: the second holder.
	s.tries[2].Insert([]byte("012345678"))
	key("0123456789")
	load(0, 9, 2)
	f(2, ReasonPrefixHit, 0.9)
	// Every holder overloaded: least load.
	load(0, 9, 9)
	f(0, ReasonOverloaded, 1)
	s.tries[2].Reset()
	s.tries[2].Insert([]byte("zz"))

	// No load known: the least-warmed target (smallest trie).
	load(0, 0, 0)
	key("nothing like it")
	f(0, ReasonLeastWarmed, 0)
}

// TestCacheAwareIneligibleNotCompared: an idle unhealthy replica neither wins nor lowers the minimum load
// that decides whether the cache holder is overloaded.
func TestCacheAwareIneligibleNotCompared(t *testing.T) {
	r, s := cacheRoute(t, 3, "")
	s.tries[0].Insert([]byte("0123456789")) // the ineligible one holds the prefix too
	s.tries[1].Insert([]byte("0123456789"))
	r.Targets[0].Provider.inflight.Store(0)
	r.Targets[1].Provider.inflight.Store(4)
	r.Targets[2].Provider.inflight.Store(2)
	p := Pick{Route: r, Key: []byte("0123456789"), Eligible: []int{1, 2}, EligibleMask: 0b110}
	for i := 0; i < 100; i++ {
		got, d := rank(r, &p)
		// With target 0 compared, min load would be 0 and target 1 overloaded (4 > 2, 4 > 0).
		if got != 1 || d.Reason != ReasonPrefixHit {
			t.Fatalf("got %d %s", got, d.Reason)
		}
	}
}

// TestCacheAwareTiesSpread: equal best matches and equal loads do not always go to the same target (a
// cold key too, without the home that would send it to one target on purpose).
func TestCacheAwareTiesSpread(t *testing.T) {
	r, s := cacheRoute(t, 4, "home = false")
	for _, tr := range s.tries {
		tr.Insert([]byte("shared system prompt"))
	}
	var buf [maxTargets]int
	var p Pick
	allEligible(r, &p, buf[:])
	p.Key = []byte("shared system prompt + question")
	counts := share(r, &p, 4000)
	assertShares(t, counts, []float64{.25, .25, .25, .25}, 0.05)
	p.Key = []byte("cold")
	for _, tr := range s.tries {
		tr.Reset()
	}
	assertShares(t, share(r, &p, 4000), []float64{.25, .25, .25, .25}, 0.05)
}

func TestCacheAwareParams(t *testing.T) {
	_, s := cacheRoute(t, 2, "threshold = 0.9\nmax_trie_nodes = 100")
	if s.threshold != 0.9 {
		t.Fatalf("threshold %v", s.threshold)
	}
	f := func(params, want string) {
		t.Helper()
		src := gatewayConfig("cache_aware", "", "http://127.0.0.1:1")
		src = strings.Replace(src, "strategy = \"cache_aware\"\n", "strategy = \"cache_aware\"\n[routes.params]\n"+params+"\n", 1)
		_, err := config.Parse([]byte(src), "p.toml")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("params %q: got %v, want %q", params, err, want)
		}
	}
	f("threshold = 1.5", "routes[0].params.threshold: must be between 0 and 1")
	f("max_trie_nodes = 0", "routes[0].params.max_trie_nodes: must be >= 16")
	f("epsilon = 0.2", `strategy "cache_aware" does not use "epsilon"`)
	f("home = 1", "home")
	f("overload_factor = 0.5", "routes[0].params.overload_factor: must be between 1 and 1000")
	f("overload_margin = -1", "routes[0].params.overload_margin: must be between 0 and 1000000")
}

// TestCacheAwareOverloadParams: overload_margin and overload_factor replace the seed rule's 2 and 1.5.
func TestCacheAwareOverloadParams(t *testing.T) {
	r, s := cacheRoute(t, 3, "home = false\noverload_margin = 4\noverload_factor = 2")
	var buf [maxTargets]int
	var p Pick
	allEligible(r, &p, buf[:])
	s.tries[1].Insert([]byte("0123456789"))
	p.Key = []byte("0123456789")
	f := func(l0, l1, l2 int64, wantTarget int, wantReason Reason) {
		t.Helper()
		r.Targets[0].Provider.inflight.Store(l0)
		r.Targets[1].Provider.inflight.Store(l1)
		r.Targets[2].Provider.inflight.Store(l2)
		if got, d := rank(r, &p); got != wantTarget || d.Reason != wantReason {
			t.Fatalf("loads %d/%d/%d: got %d %s, want %d %s", l0, l1, l2, got, d.Reason, wantTarget, wantReason)
		}
	}
	f(0, 4, 9, 1, ReasonPrefixHit)    // 4 > 0+4 is false (the seed rule: overloaded)
	f(0, 5, 9, 0, ReasonOverloaded)   // 5 > 4 and 5 > 0
	f(10, 20, 10, 1, ReasonPrefixHit) // 20 > 14 but 20 > 2x10 is false
	f(10, 21, 12, 0, ReasonOverloaded)
}

// TestCacheAwareHome: a request nothing holds goes to its conversation's rendezvous home - the same target
// for every turn and on every replica, whatever the target order - unless the home is overloaded; new
// conversations spread evenly; a target leaving moves only the conversations it was home to.
func TestCacheAwareHome(t *testing.T) {
	r, s := cacheRoute(t, 4, "")
	var buf [maxTargets]int
	var p Pick
	allEligible(r, &p, buf[:])
	homes := map[string]int{}
	counts := make([]int, 4)
	for c := 0; c < 4000; c++ {
		p.Key = []byte(fmt.Sprintf("system: you help.\x00user: question %d\x00", c))
		p.Opening = len(p.Key)
		got, d := rank(r, &p)
		if d.Reason != ReasonHome {
			t.Fatalf("conversation %d: %s, want home", c, d.Reason)
		}
		// A later turn (the opening is the same) goes home too while nothing holds it.
		p.Key = append(p.Key, "assistant: answer\x00user: more\x00"...)
		if again, d := rank(r, &p); again != got || d.Reason != ReasonHome {
			t.Fatalf("conversation %d: turn 2 to %d (%s), turn 1 to %d", c, again, d.Reason, got)
		}
		homes[string(p.Key[:p.Opening])] = got
		counts[got]++
	}
	for i, n := range counts {
		if n < 800 || n > 1200 {
			t.Fatalf("target %d is home to %d of 4000 conversations, want about 1000 (%v)", i, n, counts)
		}
	}
	// Another replica, its targets listed in another order, agrees on every home.
	w := []float64{1, 1, 1, 1}
	r2 := testRoute(t, "cache_aware", w, "")
	rev := make([]*Target, len(r2.Targets))
	for i, tg := range r2.Targets {
		rev[len(rev)-1-i] = tg
	}
	r2.Targets = rev
	var p2 Pick
	var buf2 [maxTargets]int
	allEligible(r2, &p2, buf2[:])
	// Target 2 ineligible on this one: only the conversations whose home it was move.
	p2.Eligible, p2.EligibleMask = []int{0, 2, 3}, 0b1101 // rev[1] is p2
	moved := 0
	for opening, home := range homes {
		p2.Key, p2.Opening = []byte(opening), len(opening)
		got, _ := rank(r2, &p2)
		name := r2.Targets[got].Provider.Name
		if want := r.Targets[home].Provider.Name; name != want {
			if want != "p2" {
				t.Fatalf("home of %q: %s on the other replica, %s here", opening, name, want)
			}
			moved++
		}
	}
	if moved != counts[2] {
		t.Fatalf("%d conversations moved, want the %d whose home left", moved, counts[2])
	}

	// The overload rule holds: an overloaded home gives way to the least-loaded target.
	p.Key = []byte("system: you help.\x00user: question 0\x00")
	p.Opening = len(p.Key)
	home := homes[string(p.Key)]
	r.Targets[home].Provider.inflight.Store(9)
	got, d := rank(r, &p)
	if got == home || d.Reason != ReasonLeastWarmed && d.Reason != ReasonNoMatch {
		t.Fatalf("overloaded home %d: got %d (%s)", home, got, d.Reason)
	}
	r.Targets[home].Provider.inflight.Store(2) // 2 > 0+2 is false: not overloaded
	if got, d := rank(r, &p); got != home || d.Reason != ReasonHome {
		t.Fatalf("home %d with load 2: got %d (%s)", home, got, d.Reason)
	}
	r.Targets[home].Provider.inflight.Store(0)

	// A session key names the conversation before the opening does.
	p.SessionID = []byte("session-7")
	first, _ := rank(r, &p)
	for c := 0; c < 50; c++ {
		p.Key = []byte(fmt.Sprintf("other opening %d", c))
		p.Opening = len(p.Key)
		if got, _ := rank(r, &p); got != first {
			t.Fatalf("session key: %d then %d", first, got)
		}
	}
	p.SessionID = nil

	// A held prefix still wins over the home: the learned tries are the first evidence.
	p.Key = []byte("system: you help.\x00user: question 1\x00")
	p.Opening = len(p.Key)
	other := (homes[string(p.Key)] + 1) % 4
	s.tries[other].Insert(p.Key)
	if got, d := rank(r, &p); got != other || d.Reason != ReasonPrefixHit {
		t.Fatalf("held prefix: got %d (%s), want %d prefix_hit", got, d.Reason, other)
	}
}

// simFleet starts n simulated engines and returns their URLs.
func simFleet(t *testing.T, n int, tweak func(*sim.Config)) ([]*sim.Engine, []string) {
	t.Helper()
	var engines []*sim.Engine
	var urls []string
	for i := 0; i < n; i++ {
		cfg := sim.DefaultConfig()
		cfg.EngineLabel = fmt.Sprint(i)
		if tweak != nil {
			tweak(&cfg)
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

type chatMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatTurn sends a conversation and returns the target, the decision and the assistant's reply.
func chatTurn(t *testing.T, url, model string, msgs []chatMsg) (target, decision, reply string, cached int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "messages": msgs, "max_tokens": 4})
	resp, got := post(t, url+"/v1/chat/completions", string(body))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	var r struct {
		Choices []struct{ Message chatMsg }
		Usage   struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		}
	}
	if err := json.Unmarshal([]byte(got), &r); err != nil {
		t.Fatal(err)
	}
	return resp.Header.Get("X-Rolter-Target"), resp.Header.Get("X-Rolter-Decision"), r.Choices[0].Message.Content, r.Usage.PromptTokensDetails.CachedTokens
}

var systemPrompt = strings.Repeat("You are Rolter's test assistant. Answer briefly, cite sources, never guess. ", 30)

// TestCacheAwareConversations: turns of one conversation stay on one target (and hit its cache); unrelated
// conversations spread.
func TestCacheAwareConversations(t *testing.T) {
	_, urls := simFleet(t, 4, nil)
	gw := startGateway(t, strings.ReplaceAll(gatewayConfig("cache_aware", "", urls...), `model = "up-model"`, `model = "sim-model"`))
	var convs [][]chatMsg
	var homes []string
	firstTargets := map[string]bool{}
	for c := 0; c < 4; c++ {
		msgs := []chatMsg{{"system", fmt.Sprintf("conversation %d: %s", c, strings.Repeat(fmt.Sprintf("topic-%d ", c), 50))}, {"user", "hello"}}
		target, _, reply, _ := chatTurn(t, gw.URL, "m", msgs)
		firstTargets[target] = true
		homes = append(homes, target)
		convs = append(convs, append(msgs, chatMsg{"assistant", reply}))
	}
	if len(firstTargets) != 4 {
		t.Fatalf("4 unrelated conversations went to %d targets: %v", len(firstTargets), firstTargets)
	}
	for turn := 0; turn < 3; turn++ {
		for c := range convs {
			msgs := append(convs[c], chatMsg{"user", fmt.Sprintf("question %d", turn)})
			target, decision, reply, cached := chatTurn(t, gw.URL, "m", msgs)
			if target != homes[c] || decision != "prefix_hit" || cached == 0 {
				t.Fatalf("conversation %d turn %d: on %s (home %s), decision %s, cached tokens %d", c, turn, target, homes[c], decision, cached)
			}
			convs[c] = append(msgs, chatMsg{"assistant", reply})
		}
	}
}

// TestCacheAwareBurst: 32 concurrent requests sharing one long system prompt spread over the fleet (the
// overload rule) instead of queueing on the first replica, and each conversation's next turn still lands
// where its prefix is.
func TestCacheAwareBurst(t *testing.T) {
	_, urls := simFleet(t, 4, func(c *sim.Config) {
		c.DecodePerToken = 10 * time.Millisecond // requests overlap
		c.MaxNumSeqs = 16
	})
	gw := startGateway(t, strings.ReplaceAll(gatewayConfig("cache_aware", "", urls...), `model = "up-model"`, `model = "sim-model"`))
	type result struct {
		msgs   []chatMsg
		target string
	}
	results := make([]result, 32)
	var wg sync.WaitGroup
	var mu sync.Mutex
	errs := []string{}
	for i := range results {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			msgs := []chatMsg{{"system", systemPrompt}, {"user", fmt.Sprintf("user %d asks something", i)}}
			body, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "max_tokens": 4})
			resp, err := testClient.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
			if err != nil {
				mu.Lock()
				errs = append(errs, err.Error())
				mu.Unlock()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var r struct{ Choices []struct{ Message chatMsg } }
			if json.Unmarshal(b, &r) != nil || len(r.Choices) == 0 {
				mu.Lock()
				errs = append(errs, string(b))
				mu.Unlock()
				return
			}
			results[i] = result{append(msgs, r.Choices[0].Message), resp.Header.Get("X-Rolter-Target")}
		}(i)
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("burst errors: %v", errs)
	}
	per := map[string]int{}
	for _, r := range results {
		per[r.target]++
	}
	if len(per) != 4 {
		t.Fatalf("the burst used %d of 4 targets: %v", len(per), per)
	}
	for target, n := range per {
		if n > 16 {
			t.Fatalf("target %s took %d of 32: the burst piled onto one replica (%v)", target, n, per)
		}
	}
	for i, r := range results {
		msgs := append(r.msgs, chatMsg{"user", "and a follow-up"})
		target, decision, _, cached := chatTurn(t, gw.URL, "m", msgs)
		if target != r.target || decision != "prefix_hit" || cached == 0 {
			t.Fatalf("conversation %d: turn 1 on %s, turn 2 on %s (%s, cached %d)", i, r.target, target, decision, cached)
		}
	}
}

// TestCacheAwareUnhealthyNeverPicked: the replica holding the prefix goes down; it is never picked.
func TestCacheAwareUnhealthyNeverPicked(t *testing.T) {
	_, urls := simFleet(t, 3, nil)
	gw := startGateway(t, strings.ReplaceAll(gatewayConfig("cache_aware", "", urls...), `model = "up-model"`, `model = "sim-model"`))
	msgs := []chatMsg{{"system", systemPrompt}, {"user", "hi"}}
	holder, _, _, _ := chatTurn(t, gw.URL, "m", msgs)
	for _, p := range gw.g.Snapshot().Providers {
		if p.Name == holder {
			p.health.down.Store(true)
		}
	}
	for i := 0; i < 10; i++ {
		target, decision, _, _ := chatTurn(t, gw.URL, "m", msgs)
		if target == holder {
			t.Fatalf("the unhealthy holder was picked (%s)", decision)
		}
	}
}

// TestCacheAwareEviction: a tiny max_trie_nodes evicts the oldest conversation but keeps the shared system
// prompt, which later prompts still match.
func TestCacheAwareEviction(t *testing.T) {
	r, s := cacheRoute(t, 1, "max_trie_nodes = 16")
	var buf [maxTargets]int
	var p Pick
	allEligible(r, &p, buf[:])
	conv := func(i int) []byte {
		return []byte(systemPrompt + fmt.Sprintf("\x1euser\x1fconversation number %d with its own long question", i))
	}
	for i := 0; i < 40; i++ {
		p.Key = conv(i)
		s.Routed(&p, 0)
	}
	tr := s.tries[0]
	if st := tr.Stats(); st.Nodes > 16 || st.Evictions == 0 {
		t.Fatalf("stats %+v: want <= 16 nodes and evictions", st)
	}
	first := conv(0)
	if m := tr.Match(first); m == len(first) || m < len(systemPrompt) {
		t.Fatalf("oldest conversation: matched %d of %d (system prompt %d): want it evicted, prompt kept", m, len(first), len(systemPrompt))
	}
	last := conv(39)
	if m := tr.Match(last); m != len(last) {
		t.Fatalf("newest conversation matched %d of %d", m, len(last))
	}
	p.Key = []byte(systemPrompt + "\x1euser\x1fa brand new question")
	if _, d := rank(r, &p); d.Reason != ReasonPrefixHit {
		t.Fatalf("a new prompt sharing the kept system prompt: %s %.2f", d.Reason, d.Score)
	}
}

// TestCacheAwareRecordsAtSend: a prompt is recorded in the winner's trie once it is sent, not once its answer
// comes back (docs/routing/cache-aware.md: after forwarding, record the prompt), so a request that shares its prefix and
// arrives while the first one is still being answered goes to the same target as a prefix hit.
func TestCacheAwareRecordsAtSend(t *testing.T) {
	release := make(chan struct{})
	hold := func(w http.ResponseWriter, r *http.Request) {
		if b, _ := io.ReadAll(r.Body); strings.Contains(string(b), "first question") {
			<-release
		}
		okJSON(w, r)
	}
	ups := []*fakeUpstream{newFakeUpstream(t, hold), newFakeUpstream(t, hold)}
	defer close(release)
	gw := startGateway(t, gatewayConfig("cache_aware", "", ups[0].URL, ups[1].URL))
	prefix := strings.Repeat("A long shared document that both requests open with. ", 40)
	first := make(chan string, 1)
	go func() {
		resp, _ := post(t, gw.URL+"/v1/chat/completions", chatBody("m", prefix+"first question", false))
		first <- resp.Header.Get("X-Rolter-Target")
	}()
	waitFor(t, 10*time.Second, "the first request reaching an upstream", func() bool {
		return ups[0].requests.Load()+ups[1].requests.Load() == 1
	})
	held := "p0"
	if ups[1].requests.Load() == 1 {
		held = "p1"
	}
	resp, _ := post(t, gw.URL+"/v1/chat/completions", chatBody("m", prefix+"second question", false))
	if got, d := resp.Header.Get("X-Rolter-Target"), resp.Header.Get("X-Rolter-Decision"); got != held || d != "prefix_hit" {
		t.Fatalf("while the first request (on %s) waits for its answer, the second went to %s, decision %q; want %s, prefix_hit", held, got, d, held)
	}
	release <- struct{}{}
	if got := <-first; got != held {
		t.Fatalf("first request answered from %s, want %s", got, held)
	}
}
