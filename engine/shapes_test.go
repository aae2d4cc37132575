package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/promptkey"
)

// Request shapes, cache identity and session keys through a real gateway over loopback. The
// engines are fake upstreams: the routing decision is the gateway's, read from its headers.

// fakeFleet starts n fake upstreams answering okJSON, each counting its requests and keeping the path and
// body of its last one.
func fakeFleet(t *testing.T, n int) ([]*fakeUpstream, []string) {
	t.Helper()
	ups := make([]*fakeUpstream, n)
	urls := make([]string, n)
	for i := range ups {
		ups[i] = newFakeUpstream(t, okJSON)
		urls[i] = ups[i].URL
	}
	return ups, urls
}

// routed posts body to path and returns the target and the decision, failing on anything but 200.
func routed(t *testing.T, gw *testGateway, path, body string, hdr ...string) (target, decision string) {
	t.Helper()
	resp, got := post(t, gw.URL+path, body, hdr...)
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s %s: status %d: %s", path, body, resp.StatusCode, got)
	}
	return resp.Header.Get("X-Rolter-Target"), resp.Header.Get("X-Rolter-Decision")
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// longSystem is a system prompt long enough that a conversation's second turn shares more than half its
// key with the first.
var longSystem = strings.Repeat("You are the shapes test assistant; answer in one line. ", 20)

// TestResponsesAndMessagesPrefixHit: /v1/responses and /v1/messages conversations get prompt keys - their
// second turn is a prefix_hit on the target that served the first - and one conversation has one key
// whichever endpoint carries it.
func TestResponsesAndMessagesPrefixHit(t *testing.T) {
	ups, urls := fakeFleet(t, 4)
	gw := startGateway(t, gatewayConfig("cache_aware", "", urls...))
	type msg = map[string]any
	f := func(path string, turn func(n int) string) {
		t.Helper()
		home, d := routed(t, gw, path, turn(1))
		if d != "home" {
			t.Fatalf("%s turn 1: decision %s, want home (a cold fleet)", path, d)
		}
		for n := 2; n <= 4; n++ {
			if target, d := routed(t, gw, path, turn(n)); target != home || d != "prefix_hit" {
				t.Fatalf("%s turn %d: %s (%s), want %s (prefix_hit)", path, n, target, d, home)
			}
		}
	}
	for c := 0; c < 3; c++ {
		responses := func(n int) string {
			var input []msg
			for k := 1; k <= n; k++ {
				input = append(input, msg{"type": "message", "role": "user", "content": []msg{{"type": "input_text", "text": fmt.Sprintf("conversation %d question %d", c, k)}}})
				if k < n {
					input = append(input, msg{"type": "message", "role": "assistant", "content": []msg{{"type": "output_text", "text": "answer"}}})
				}
			}
			return mustJSON(msg{"model": "m", "instructions": fmt.Sprint(c, longSystem), "input": input})
		}
		f("/v1/responses", responses)
		messages := func(n int) string {
			var msgs []msg
			for k := 1; k <= n; k++ {
				msgs = append(msgs, msg{"role": "user", "content": []msg{{"type": "text", "text": fmt.Sprintf("thread %d question %d", c, k)}}})
				if k < n {
					msgs = append(msgs, msg{"role": "assistant", "content": "answer"})
				}
			}
			return mustJSON(msg{"model": "m", "max_tokens": 16, "system": []msg{{"type": "text", "text": fmt.Sprint("thread ", c, longSystem)}}, "messages": msgs})
		}
		f("/v1/messages", messages)
	}
	// The same conversation as chat is a prefix_hit where /v1/messages put it.
	home, _ := routed(t, gw, "/v1/messages", mustJSON(msg{"model": "m", "system": longSystem, "messages": []msg{{"role": "user", "content": "cross-endpoint"}}}))
	chat := mustJSON(msg{"model": "m", "messages": []msg{{"role": "system", "content": longSystem}, {"role": "user", "content": "cross-endpoint"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}}})
	if target, d := routed(t, gw, "/v1/chat/completions", chat); target != home || d != "prefix_hit" {
		t.Fatalf("chat after messages: %s (%s), want %s (prefix_hit)", target, d, home)
	}
	// Forwarded to the same path, with only the model replaced.
	for _, u := range ups {
		if body, _ := u.last(); body != "" && !strings.Contains(body, `"model":"up-model"`) {
			t.Fatalf("upstream body %s: model not replaced", body)
		}
	}
}

// TestOtherEndpointProxied: another POST /v1/* JSON body with a model is routed by its model (on an empty
// key: load-based) and forwarded to the same path; the engines' administration paths are not reachable.
func TestOtherEndpointProxied(t *testing.T) {
	var mu sync.Mutex
	var paths []string
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.RequestURI())
		mu.Unlock()
		okJSON(w, r)
	})
	gw := startGateway(t, gatewayConfig("cache_aware", "", up.URL))
	if _, d := routed(t, gw, "/v1/foo?x=1", `{"model":"m","query":"q","documents":["a"]}`); d != "least_warmed" {
		t.Fatalf("decision %s, want least_warmed (no prompt key)", d)
	}
	if body, _ := up.last(); body != `{"model":"up-model","query":"q","documents":["a"]}` {
		t.Fatalf("upstream body %s", body)
	}
	routed(t, gw, "/v1/audio/speech", `{"input":"read me","model":"m"}`)
	mu.Lock()
	if got := strings.Join(paths, " "); got != "/v1/foo?x=1 /v1/audio/speech" {
		t.Fatalf("upstream paths %q", got)
	}
	mu.Unlock()
	f := func(method, path, body string, status int, code string) {
		t.Helper()
		req, _ := http.NewRequest(method, gw.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct{ Error openAIError }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != status || e.Error.Code != code {
			t.Fatalf("%s %s: %d %q, want %d %q", method, path, resp.StatusCode, e.Error.Code, status, code)
		}
	}
	f("POST", "/v1/foo", `{"query":"q"}`, 400, "missing_model")
	f("POST", "/v1/foo", `{"model":"nope"}`, 404, "model_not_found")
	f("POST", "/v1/load_lora_adapter", `{"model":"m","lora_name":"x","lora_path":"/tmp/x"}`, 404, "not_found")
	f("POST", "/v1/unload_lora_adapter/", `{"model":"m","lora_name":"x"}`, 404, "not_found")
	f("POST", "/v1/x/../load_lora_adapter", `{"model":"m","lora_name":"x"}`, 404, "not_found")
	f("POST", "/v2/foo", `{"model":"m"}`, 404, "not_found")
	f("GET", "/v1/foo", ``, 404, "not_found")
	f("GET", "/v1/responses", ``, 405, "method_not_allowed")
	f("GET", "/v1/messages", ``, 405, "method_not_allowed")
	if n := up.requests.Load(); n != 2 {
		t.Fatalf("upstream saw %d requests, want 2", n)
	}
}

// TestCacheIdentityAffinity: requests the engine caches apart - another cache_salt, another value of a
// cache_key_fields field - never get prefix_hit on each other's prompts; the same identity does.
func TestCacheIdentityAffinity(t *testing.T) {
	_, urls := fakeFleet(t, 2)
	cfg := strings.Replace(gatewayConfig("cache_aware", "", urls...), "[server]\n", "[server]\ncache_key_fields = [\"user\"]\n", 1)
	gw := startGateway(t, cfg)
	body := func(extra string) string {
		return `{"model":"m",` + extra + `"messages":[{"role":"system","content":"` + longSystem + `"},{"role":"user","content":"the same question"}]}`
	}
	f := func(extra, want string) {
		t.Helper()
		if _, d := routed(t, gw, "/v1/chat/completions", body(extra)); d != want {
			t.Fatalf("%s: decision %s, want %s", extra, d, want)
		}
	}
	f(`"cache_salt":"tenant-a",`, "home")
	f(`"cache_salt":"tenant-a",`, "prefix_hit")
	f(`"cache_salt":"tenant-b",`, "home")
	f(`"cache_salt":"tenant-b",`, "prefix_hit")
	f(``, "home")
	f(`"cache_salt":null,`, "prefix_hit")
	f(`"user":"alice",`, "home")
	f(`"user":"alice",`, "prefix_hit")
	f(`"user":"bob",`, "home")
	f(`"cache_salt":"tenant-a","user":"alice",`, "home")
	f(`"user":"alice","cache_salt":"tenant-a",`, "prefix_hit")
}

// TestLoRATargetsDoNotShareAffinity: a LoRA adapter served under its own model name on the same engines as
// its base model is a different cache. The upstream model is part of the identity where matching happens -
// every trie belongs to one target, (provider, upstream model) - so a prompt the adapter served is no
// prefix_hit for the base model on the same engine, nor the other way round, within a route or across two.
func TestLoRATargetsDoNotShareAffinity(t *testing.T) {
	_, urls := fakeFleet(t, 2)
	var b strings.Builder
	b.WriteString("[server]\nlisten = \"127.0.0.1:0\"\n")
	for i, u := range urls {
		fmt.Fprintf(&b, "[[providers]]\nname = \"e%d\"\napi_base = %q\n", i, u)
	}
	for _, r := range []struct{ model, up string }{{"base", "llama"}, {"sql", "llama-sql-lora"}} {
		fmt.Fprintf(&b, "[[routes]]\nmodel = %q\nstrategy = \"cache_aware\"\n", r.model)
		for i := range urls {
			fmt.Fprintf(&b, "[[routes.targets]]\nprovider = \"e%d\"\nmodel = %q\n", i, r.up)
		}
	}
	// One route whose two targets are the base model and the adapter on one engine (a second provider
	// name for it: a route's target metrics are labelled by provider).
	fmt.Fprintf(&b, "[[providers]]\nname = \"e0-adapters\"\napi_base = %q\n", urls[0])
	b.WriteString("[[routes]]\nmodel = \"mixed\"\nstrategy = \"cache_aware\"\n")
	b.WriteString("[[routes.targets]]\nprovider = \"e0\"\nmodel = \"llama\"\n[[routes.targets]]\nprovider = \"e0-adapters\"\nmodel = \"llama-sql-lora\"\n")
	gw := startGateway(t, b.String())
	chat := func(model string) string { return chatBody(model, "SELECT the same prompt "+longSystem, false) }
	lora, d := routed(t, gw, "/v1/chat/completions", chat("sql"))
	if d != "home" {
		t.Fatalf("first adapter request: %s", d)
	}
	if target, d := routed(t, gw, "/v1/chat/completions", chat("sql")); target != lora || d != "prefix_hit" {
		t.Fatalf("second adapter request: %s (%s), want %s prefix_hit", target, d, lora)
	}
	if _, d := routed(t, gw, "/v1/chat/completions", chat("base")); d == "prefix_hit" {
		t.Fatalf("the base model got prefix_hit on the adapter's prompt")
	}
	// Within one route: the target that served the prompt matches it, the other model on the same engine
	// does not.
	snap := gw.g.Snapshot()
	r := snap.route([]byte("mixed"))
	routed(t, gw, "/v1/chat/completions", chat("mixed"))
	var s promptkey.Scanner
	var info promptkey.Info
	if e := s.Scan([]byte(chat("mixed")), promptkey.Chat, nil, &info); e != nil {
		t.Fatal(e.Message)
	}
	tries := r.Strategy.(trieHolder).triesOf()
	m0, m1 := tries[0].Match(info.Key), tries[1].Match(info.Key)
	if max(m0, m1) != len(info.Key) || min(m0, m1) != 0 {
		t.Fatalf("matches of the two models on one engine: %d and %d of %d; want the full key on one, nothing on the other", m0, m1, len(info.Key))
	}
}

// TestPromptCacheKeyPins: the body's prompt_cache_key pins a conversation like x-session-id (pipeline's
// session bindings), and so does an operator-listed session header; x-session-id comes first.
func TestPromptCacheKeyPins(t *testing.T) {
	_, urls := fakeFleet(t, 4)
	cfg := strings.Replace(gatewayConfig("pipeline", "", urls...), "[server]\n", "[server]\nsession_headers = [\"x-agent-session\"]\n", 1)
	gw := startGateway(t, cfg)
	pinned := func(what string, body func(i int) string, hdr ...string) string {
		t.Helper()
		var home string
		for i := 0; i < 12; i++ {
			target, d := routed(t, gw, "/v1/chat/completions", body(i), hdr...)
			if i == 0 {
				home = target
				continue
			}
			if target != home || d != "session" {
				t.Fatalf("%s: request %d went to %s (%s), session home %s", what, i, target, d, home)
			}
		}
		return home
	}
	withKey := func(key string) func(int) string {
		return func(i int) string {
			return fmt.Sprintf(`{"model":"m","prompt_cache_key":%q,"messages":[{"role":"user","content":"unrelated question %d %s"}]}`, key, i, strings.Repeat("x", i))
		}
	}
	pinned("prompt_cache_key", withKey("conv-1"))
	pinned("session header", func(i int) string { return chatBody("m", fmt.Sprint("agent step ", i), false) }, "X-Agent-Session", "agent-9")
	// Without a session key the same requests are scored, not pinned; x-session-id comes before the body's key.
	if _, d := routed(t, gw, "/v1/chat/completions", chatBody("m", "agent step 3", false), "X-Other", "agent-9"); d != "score" {
		t.Fatalf("no session key: decision %s, want score", d)
	}
	pinned("x-session-id first", func(i int) string {
		if i == 0 {
			return chatBody("m", "first", false)
		}
		return withKey(fmt.Sprint("conv-", 100+i))(i)
	}, "X-Session-Id", "s-1")
	if _, d := routed(t, gw, "/v1/chat/completions", withKey("conv-new")(0)); d != "score" {
		t.Fatalf("a new prompt_cache_key: decision %s, want score (no binding yet)", d)
	}
}

// TestSessionIDOrder: x-session-id, then prompt_cache_key, then the configured headers in their order.
func TestSessionIDOrder(t *testing.T) {
	f := func(hdr []string, bodyKey string, want string) {
		t.Helper()
		var h fasthttp.RequestHeader
		for i := 0; i+1 < len(hdr); i += 2 {
			h.Set(hdr[i], hdr[i+1])
		}
		var bk []byte
		if bodyKey != "" {
			bk = []byte(bodyKey)
		}
		if got := string(sessionID(&h, h.Peek("X-Session-Id"), bk, []string{"x-claude-session", "X-Agent-Id"})); got != want {
			t.Fatalf("headers %v, prompt_cache_key %q: session %q, want %q", hdr, bodyKey, got, want)
		}
	}
	f(nil, "", "")
	f([]string{"X-Session-Id", "s", "X-Claude-Session", "c"}, "k", "s")
	f([]string{"X-Claude-Session", "c", "X-Agent-Id", "a"}, "k", "k")
	f([]string{"X-Agent-Id", "a", "X-Claude-Session", "c"}, "", "c")
	f([]string{"x-agent-id", "a"}, "", "a")
	f([]string{"X-Session-Id", "", "X-Agent-Id", "a"}, "", "a")
	f([]string{"X-Other", "o"}, "", "")
}

// TestConsistentHashOpening: consistent_hash keys on the conversation's opening. Under one shared system
// prompt, conversations spread over the ring by their first user turn - evenly, as unrelated keys do - and
// every later turn of a conversation lands where its first did. With key_bytes below the system prompt it
// is the old behaviour again: everything on one target.
func TestConsistentHashOpening(t *testing.T) {
	system := strings.Repeat("A long shared agent system prompt with tools and rules. ", 70) // ~4 KiB
	key := func(user, turns int) string {
		msgs := []map[string]any{{"role": "system", "content": system}}
		for k := 0; k < turns; k++ {
			msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprintf("user %d asks question %d", user, k)},
				map[string]any{"role": "assistant", "content": "answer"})
		}
		return mustJSON(map[string]any{"model": "m", "messages": msgs})
	}
	pick := func(r *Route, body string) int {
		t.Helper()
		var s promptkey.Scanner
		var info promptkey.Info
		if e := s.Scan([]byte(body), promptkey.Chat, nil, &info); e != nil {
			t.Fatal(e.Message)
		}
		var buf [maxTargets]int
		p := Pick{Key: info.Key, Opening: info.Opening}
		allEligible(r, &p, buf[:])
		got, d := rank(r, &p)
		if d.Reason != ReasonHash {
			t.Fatalf("decision %s", d.Reason)
		}
		return got
	}
	w := []float64{1, 1, 1, 1, 1, 1, 1, 1}
	r := testRoute(t, "consistent_hash", w, "")
	const users = 4000
	counts := make([]int, len(w))
	for u := 0; u < users; u++ {
		home := pick(r, key(u, 1))
		counts[home]++
		if u%40 == 0 {
			for turns := 2; turns <= 4; turns++ {
				if got := pick(r, key(u, turns)); got != home {
					t.Fatalf("user %d turn %d on target %d, first turn on %d", u, turns, got, home)
				}
			}
		}
	}
	t.Logf("shares of %d conversations under one system prompt: %v", users, counts)
	for i, c := range counts {
		if c < users/8*7/10 || c > users/8*13/10 {
			t.Fatalf("target %d holds %d of %d conversations: %v", i, c, users, counts)
		}
	}
	short := testRoute(t, "consistent_hash", w, "key_bytes = 256")
	first := pick(short, key(0, 1))
	for u := 1; u < 50; u++ {
		if got := pick(short, key(u, 1)); got != first {
			t.Fatalf("key_bytes = 256 under a 4 KiB system prompt: user %d on %d, user 0 on %d; want one target", u, got, first)
		}
	}
	// No prompt key and no session: least load, not one ring point for every request.
	var buf [maxTargets]int
	p := Pick{}
	allEligible(r, &p, buf[:])
	r.Targets[3].Provider.inflight.Store(-100)
	defer r.Targets[3].Provider.inflight.Store(0)
	if got, d := rank(r, &p); got != 3 || d.Reason != ReasonLeastLoad {
		t.Fatalf("empty key: %d %s, want the least-loaded target 3 (least_load)", got, d.Reason)
	}
}

// TestConsistentHashSharedSystemPromptFleet: 8 users of an agent sharing one system prompt, each opening 8
// conversations of 3 turns, over 8 engines through the gateway: every engine is busy, none takes more than
// 2.5 times its share, and each conversation stays on its engine.
func TestConsistentHashSharedSystemPromptFleet(t *testing.T) {
	ups, urls := fakeFleet(t, 8)
	gw := startGateway(t, gatewayConfig("consistent_hash", "", urls...))
	system := strings.Repeat("You are an agent. Follow the tool rules; be careful with files. ", 50)
	type msg = map[string]string
	for user := 0; user < 8; user++ {
		for conv := 0; conv < 8; conv++ {
			msgs := []msg{{"role": "system", "content": system}}
			var home string
			for turn := 0; turn < 3; turn++ {
				msgs = append(msgs, msg{"role": "user", "content": fmt.Sprintf("user %d, task %d, step %d", user, conv, turn)})
				target, d := routed(t, gw, "/v1/chat/completions", mustJSON(map[string]any{"model": "m", "messages": msgs}))
				if d != "hash" || (turn > 0 && target != home) {
					t.Fatalf("user %d conversation %d turn %d: %s (%s), first turn on %s", user, conv, turn, target, d, home)
				}
				home = target
				msgs = append(msgs, msg{"role": "assistant", "content": "done"})
			}
		}
	}
	var counts []int64
	for _, u := range ups {
		counts = append(counts, u.requests.Load())
	}
	t.Logf("requests per engine: %v", counts)
	for i, n := range counts {
		if n == 0 || n > 8*8*3/8*5/2 {
			t.Fatalf("engine %d served %d of %d requests: %v", i, n, 8*8*3, counts)
		}
	}
}

// TestSessionAndIdentityConfig: [server] cache_key_fields and session_headers are validated completely,
// every error at once with its line.
func TestSessionAndIdentityConfig(t *testing.T) {
	f := func(server string, want ...string) {
		t.Helper()
		src := "[server]\n" + server + "\n[[providers]]\nname = \"p\"\napi_base = \"http://127.0.0.1:1\"\n[[routes]]\nmodel = \"m\"\n[[routes.targets]]\nprovider = \"p\"\n"
		_, err := config.Parse([]byte(src), "s.toml")
		if len(want) == 0 {
			if err != nil {
				t.Fatalf("%s: %s", server, err)
			}
			return
		}
		if err == nil {
			t.Fatalf("%s: no error, want %q", server, want)
		}
		var ce config.Errors
		if !errors.As(err, &ce) || len(ce) != len(want) {
			t.Fatalf("%s: %d errors, want %d:\n%s", server, len(ce), len(want), err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("%s: error output lacks %q:\n%s", server, w, err)
			}
		}
	}
	f(`cache_key_fields = ["user", "metadata"]` + "\n" + `session_headers = ["x-claude-code-session-id", "X-Agent-Run"]`)
	f(`cache_key_fields = ["user", "", "model", "cache_salt", "user", "`+strings.Repeat("x", 33)+`"]`,
		`s.toml:2: server.cache_key_fields[1]: a field name must have 1 to 32 bytes, got ""`,
		`server.cache_key_fields[2]: "model" is read by the gateway itself`,
		`server.cache_key_fields[3]: "cache_salt" is read by the gateway itself`,
		`server.cache_key_fields[4]: "user" is listed twice`,
		`server.cache_key_fields[5]: a field name must have 1 to 32 bytes`)
	f(`cache_key_fields = ["a", "b", "c", "d", "e", "f", "g", "h", "i"]`, `server.cache_key_fields: at most 8 fields, got 9`)
	f(`session_headers = ["x-a", "X-Session-Id", "bad header", "X-A", "host"]`,
		`s.toml:2: server.session_headers[1]: x-session-id is always read first`,
		`server.session_headers[2]: invalid header name "bad header"`,
		`server.session_headers[3]: "X-A" is listed twice`,
		`server.session_headers[4]: invalid header name "host"`)
}
