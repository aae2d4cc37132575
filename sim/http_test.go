package sim

import (
	"encoding/json"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestCompletionShapes(t *testing.T) {
	e := startEngine(t, testConfig())
	c := newClient(t, 10*time.Second)

	status, hdr, b, err := c.post(e.URL()+"/v1/chat/completions", chatBody("hello there", `,"max_tokens":3`), "X-Request-Id", "req-42")
	if err != nil || status != 200 {
		t.Fatalf("chat: %d %s %v", status, b, err)
	}
	if got := hdr.Get("X-Request-Id"); got != "req-42" {
		t.Fatalf("X-Request-Id echoed as %q", got)
	}
	var out completion
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.ID != "chatcmpl-req-42" || out.Object != "chat.completion" || out.Model != "sim-model" {
		t.Fatalf("chat head: %+v", out)
	}
	if len(out.Choices) != 1 || out.Choices[0].Message.Role != "assistant" || out.Choices[0].Message.Content != " the sim is" ||
		out.Choices[0].FinishReason != "length" {
		t.Fatalf("chat choices: %s", b)
	}
	u := out.Usage
	if u == nil || u.CompletionTokens != 3 || u.PromptTokens == 0 || u.TotalTokens != u.PromptTokens+3 {
		t.Fatalf("chat usage: %s", b)
	}
	if !strings.Contains(string(b), `"prompt_tokens_details":{"cached_tokens":0}`) {
		t.Fatalf("no cached_tokens in %s", b)
	}

	// completions: default max tokens (4 in testConfig), finish "stop" as if EOS came.
	status, out = c.completion(e.URL()+"/v1/completions", `{"model":"sim-model","prompt":"hello"}`)
	if status != 200 || !strings.HasPrefix(out.ID, "cmpl-") || out.Object != "text_completion" ||
		out.Choices[0].Text != " the sim is a" || out.Choices[0].FinishReason != "stop" || out.Usage.CompletionTokens != 4 {
		t.Fatalf("completion: %d %+v", status, out)
	}
	// max_completion_tokens wins, a prompt of token ids works, the model may be left out.
	status, out = c.completion(e.URL()+"/v1/completions", `{"prompt":[5,6,7],"max_completion_tokens":2}`)
	if status != 200 || out.Usage.PromptTokens != 3 || out.Usage.CompletionTokens != 2 {
		t.Fatalf("token prompt: %d %+v", status, out)
	}
}

func TestStreamShapes(t *testing.T) {
	e := startEngine(t, testConfig())
	c := newClient(t, 10*time.Second)

	status, s := c.stream(e.URL()+"/v1/chat/completions",
		chatBody("hi", `,"stream":true,"stream_options":{"include_usage":true},"max_tokens":3`))
	if status != 200 || !s.done || s.err != nil {
		t.Fatalf("chat stream: status %d done %v err %v", status, s.done, s.err)
	}
	// role, 3 tokens, usage
	if len(s.events) != 5 {
		t.Fatalf("got %d events, want 5: %q", len(s.events), s.events)
	}
	var chunks []completion
	for _, ev := range s.events {
		var ch completion
		if err := json.Unmarshal([]byte(ev), &ch); err != nil {
			t.Fatalf("event %q: %s", ev, err)
		}
		if ch.Object != "chat.completion.chunk" {
			t.Fatalf("event object %q", ch.Object)
		}
		chunks = append(chunks, ch)
	}
	if chunks[0].Choices[0].Delta.Role != "assistant" {
		t.Fatalf("first event is not the role: %s", s.events[0])
	}
	text := ""
	for _, ch := range chunks[1:4] {
		text += ch.Choices[0].Delta.Content
	}
	if text != " the sim is" || chunks[3].Choices[0].FinishReason != "length" {
		t.Fatalf("stream text %q, finish %q", text, chunks[3].Choices[0].FinishReason)
	}
	last := chunks[4]
	if len(last.Choices) != 0 || last.Usage == nil || last.Usage.CompletionTokens != 3 {
		t.Fatalf("usage event: %s", s.events[4])
	}
	if !strings.Contains(s.events[4], `"choices":[]`) {
		t.Fatalf("usage event must carry choices []: %s", s.events[4])
	}

	// completions stream without usage: tokens only.
	status, s = c.stream(e.URL()+"/v1/completions", `{"prompt":"hi","stream":true,"max_tokens":2}`)
	if status != 200 || !s.done || len(s.events) != 2 || strings.Contains(s.events[1], "usage") {
		t.Fatalf("completion stream: %d %+v", status, s)
	}
}

func TestErrorShapes(t *testing.T) {
	e := startEngine(t, testConfig())
	c := newClient(t, 10*time.Second)
	f := func(path, body string, wantStatus int, wantType, wantMsg string) {
		t.Helper()
		status, out := c.completion(e.URL()+path, body)
		if status != wantStatus || out.Error == nil || out.Error.Type != wantType || out.Error.Code != wantStatus ||
			out.Error.Param != nil || !strings.Contains(out.Error.Message, wantMsg) {
			t.Fatalf("%s %s: status %d error %+v", path, body, status, out.Error)
		}
	}
	f("/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404, "NotFoundError", "The model `nope` does not exist.")
	f("/v1/completions", `{"model":"nope","prompt":"x"}`, 404, "NotFoundError", "does not exist")
	f("/tokenize", `{"model":"nope","prompt":"x"}`, 404, "NotFoundError", "does not exist")
	f("/v1/chat/completions", `{"messages":[`, 400, "BadRequestError", "cannot parse")
	f("/v1/chat/completions", `{"messages":[]}`, 400, "BadRequestError", "messages")
	f("/v1/completions", `{"prompt":"x","max_tokens":0}`, 400, "BadRequestError", "max_tokens must be at least 1")
	f("/v1/completions", `{"max_tokens":3}`, 400, "BadRequestError", "prompt is required")
	f("/v1/completions", `{"prompt":"`+words("long", 40000)+`"}`, 400, "BadRequestError", "maximum context length is 32768 tokens")

	status, b := c.get(e.URL() + "/nope")
	if status != 404 || string(b) != `{"detail":"Not Found"}` {
		t.Fatalf("unknown path: %d %s", status, b)
	}
	status, _ = c.get(e.URL() + "/v1/completions")
	if status != 405 {
		t.Fatalf("GET completions: %d", status)
	}
}

func TestInfoEndpoints(t *testing.T) {
	cfg := testConfig()
	cfg.Model = "org/m"
	cfg.NumBlocks = 64
	e := startEngine(t, cfg)
	c := newClient(t, 10*time.Second)
	if status, b := c.get(e.URL() + "/health"); status != 200 || len(b) != 0 {
		t.Fatalf("/health: %d %q", status, b)
	}
	status, b := c.get(e.URL() + "/v1/models")
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			Object      string `json:"object"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &models); err != nil || status != 200 || models.Object != "list" || len(models.Data) != 1 ||
		models.Data[0].ID != "org/m" || models.Data[0].MaxModelLen != 64*16 {
		t.Fatalf("/v1/models: %d %s %v", status, b, err)
	}
	lm := func() (float64, bool) {
		t.Helper()
		status, b := c.get(e.URL() + "/lmcache/status")
		var st struct {
			Occupancy      *float64 `json:"occupancy"`
			CacheAvailable *bool    `json:"cache_available"`
		}
		if err := json.Unmarshal(b, &st); err != nil || status != 200 || st.Occupancy == nil || st.CacheAvailable == nil {
			t.Fatalf("/lmcache/status: %d %s %v", status, b, err)
		}
		return *st.Occupancy, *st.CacheAvailable
	}
	if occ, ok := lm(); occ != 0 || !ok {
		t.Fatalf("empty cache: occupancy %v available %v", occ, ok)
	}
	c.completion(e.URL()+"/v1/completions", `{"model":"org/m","prompt":"`+words("occupy", 100)+`"}`)
	if occ, ok := lm(); occ <= 0 || occ > 1 || !ok {
		t.Fatalf("after a request: occupancy %v available %v", occ, ok)
	}
}

func TestMetricsExposition(t *testing.T) {
	cfg := testConfig()
	cfg.EngineLabel = "3"
	e := startEngine(t, cfg)
	c := newClient(t, 10*time.Second)
	_, b := c.get(e.URL() + "/metrics")
	for _, want := range []string{
		"# HELP vllm:num_requests_running ",
		"# TYPE vllm:num_requests_running gauge\n",
		`vllm:num_requests_running{engine="3",model_name="sim-model"} 0.0` + "\n",
		`vllm:num_requests_waiting{engine="3",model_name="sim-model"} 0.0` + "\n",
		`vllm:kv_cache_usage_perc{engine="3",model_name="sim-model"} 0.0` + "\n",
		"# TYPE vllm:prefix_cache_queries_total counter\n",
		`vllm:prefix_cache_queries_total{engine="3",model_name="sim-model"} 0.0` + "\n",
		"# TYPE vllm:prefix_cache_hits_total counter\n",
		`vllm:prefix_cache_hits_total{engine="3",model_name="sim-model"} 0.0` + "\n",
		"# TYPE vllm:prefix_cache_hits_created gauge\n",
	} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("/metrics lacks %q:\n%s", want, b)
		}
	}
}

func TestPyFloat(t *testing.T) {
	f := func(v float64, want string) {
		t.Helper()
		if got := string(appendPyFloat(nil, v)); got != want {
			t.Fatalf("appendPyFloat(%v) = %q, want %q", v, got, want)
		}
	}
	f(0, "0.0")
	f(3, "3.0")
	f(0.25, "0.25")
	f(4096, "4096.0")
	f(123456, "123456.0")
	f(1234567, "1.234567e+06")
	f(1000000, "1e+06")
	f(1795989349.134967, "1.795989349134967e+09")
	f(0.0001, "0.0001")
	f(0.00001, "1e-05")
	f(1e16, "1e+16")
}

func TestPrefixCacheHitsAndMisses(t *testing.T) {
	e := startEngine(t, testConfig())
	c := newClient(t, 10*time.Second)
	url := e.URL() + "/v1/chat/completions"
	prompt := chatBody(words("repeat", 200), "")

	_, first := c.completion(url, prompt)
	if first.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("cold request hit %d tokens", first.Usage.PromptTokensDetails.CachedTokens)
	}
	m1 := c.metrics(e.URL())
	_, second := c.completion(url, prompt)
	cached := second.Usage.PromptTokensDetails.CachedTokens
	wantCached := (second.Usage.PromptTokens - 1) / 16 * 16
	if cached != wantCached || cached == 0 {
		t.Fatalf("warm request cached %d tokens, want %d", cached, wantCached)
	}
	m2 := c.metrics(e.URL())
	if d := m2["vllm:prefix_cache_hits_total"] - m1["vllm:prefix_cache_hits_total"]; d != float64(cached) {
		t.Fatalf("prefix_cache_hits_total grew by %v, want %d", d, cached)
	}
	if d := m2["vllm:prefix_cache_queries_total"] - m1["vllm:prefix_cache_queries_total"]; d != float64(second.Usage.PromptTokens) {
		t.Fatalf("prefix_cache_queries_total grew by %v, want %d", d, second.Usage.PromptTokens)
	}
	// A different prompt (different first block) misses.
	_, other := c.completion(url, chatBody(words("different", 200), ""))
	if other.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("different prompt hit %d tokens", other.Usage.PromptTokensDetails.CachedTokens)
	}
	st := e.Stats()
	if st.HitRequests != 1 || st.MissRequests != 2 || st.Completed != 3 {
		t.Fatalf("stats %+v", st)
	}
	// The next turn of the conversation hits the whole first turn.
	turn2 := `{"messages":[{"role":"user","content":"` + words("repeat", 200) + `"},{"role":"assistant","content":"ok"},{"role":"user","content":"more"}]}`
	_, next := c.completion(url, turn2)
	if got := next.Usage.PromptTokensDetails.CachedTokens; got < first.Usage.PromptTokens/16*16 {
		t.Fatalf("second turn cached %d tokens, first turn had %d", got, first.Usage.PromptTokens)
	}
}

func TestTokenizeMatchesCache(t *testing.T) {
	e := startEngine(t, testConfig())
	c := newClient(t, 10*time.Second)
	var tok struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []uint32 `json:"tokens"`
	}
	msgs := `"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` + words("tok", 120) + `"}]`
	status, _, b, err := c.post(e.URL()+"/tokenize", `{"model":"sim-model",`+msgs+`}`)
	if err != nil || status != 200 || json.Unmarshal(b, &tok) != nil || tok.Count != len(tok.Tokens) || tok.MaxModelLen != 32768 {
		t.Fatalf("/tokenize: %d %s %v", status, b, err)
	}
	// The chat request caches exactly the tokens /tokenize returned: sending those ids as a
	// completions prompt hits every full block but the last token's.
	_, chat := c.completion(e.URL()+"/v1/chat/completions", `{`+msgs+`}`)
	if chat.Usage.PromptTokens != tok.Count {
		t.Fatalf("chat has %d prompt tokens, /tokenize %d", chat.Usage.PromptTokens, tok.Count)
	}
	ids, _ := json.Marshal(tok.Tokens)
	_, again := c.completion(e.URL()+"/v1/completions", `{"prompt":`+string(ids)+`}`)
	if got, want := again.Usage.PromptTokensDetails.CachedTokens, (tok.Count-1)/16*16; got != want || want == 0 {
		t.Fatalf("cached %d tokens, want %d", got, want)
	}
	// The prompt form matches AppendTokens.
	status, _, b, _ = c.post(e.URL()+"/tokenize", `{"prompt":"hello world"}`)
	if err := json.Unmarshal(b, &tok); err != nil || status != 200 {
		t.Fatalf("/tokenize prompt: %d %s", status, b)
	}
	if want := AppendTokens(nil, []byte("hello world")); fmt.Sprint(tok.Tokens) != fmt.Sprint(want) {
		t.Fatalf("/tokenize %v, AppendTokens %v", tok.Tokens, want)
	}
	// add_generation_prompt=false drops the generation prompt.
	status, _, b, _ = c.post(e.URL()+"/tokenize", `{`+msgs+`,"add_generation_prompt":false}`)
	var noGen struct {
		Count int `json:"count"`
	}
	if json.Unmarshal(b, &noGen) != nil || status != 200 || noGen.Count != chat.Usage.PromptTokens-len(appendGenerationPrompt(nil)) {
		t.Fatalf("add_generation_prompt=false: %d %s", status, b)
	}
}

func TestQueueSaturation(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumSeqs = 2
	cfg.DecodePerToken = 25 * time.Millisecond
	cfg.MaxTokens = 16 // 375ms per request
	e := startEngine(t, cfg)
	c := newClient(t, 20*time.Second)
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, _, b, err := c.post(e.URL()+"/v1/completions", fmt.Sprintf(`{"prompt":"queue %d"}`, i))
			if err != nil || status != 200 {
				t.Errorf("request %d: %d %s %v", i, status, b, err)
			}
		}()
	}
	var m map[string]float64
	eventually(t, "waiting requests on /metrics", func() bool {
		m = c.metrics(e.URL())
		return m["vllm:num_requests_waiting"] > 0
	})
	if m["vllm:num_requests_running"] != 2 {
		t.Fatalf("saturated engine runs %v requests, want 2", m["vllm:num_requests_running"])
	}
	if m["vllm:kv_cache_usage_perc"] <= 0 {
		t.Fatalf("kv_cache_usage_perc %v while running", m["vllm:kv_cache_usage_perc"])
	}
	wg.Wait()
	m = c.metrics(e.URL())
	if m["vllm:num_requests_waiting"] != 0 || m["vllm:num_requests_running"] != 0 || m["vllm:kv_cache_usage_perc"] != 0 {
		t.Fatalf("idle engine metrics %v", m)
	}
	if st := e.Stats(); st.Completed != 6 {
		t.Fatalf("completed %d of 6", st.Completed)
	}
}

func TestColdPromptSlowerThanWarm(t *testing.T) {
	cfg := testConfig()
	cfg.PrefillPerToken = 50 * time.Microsecond // ~200ms for a cold 4k-token prompt
	cfg.MaxTokens = 1
	e := startEngine(t, cfg)
	c := newClient(t, 20*time.Second)
	prompt := words("timing", 2400)
	if n := len(AppendTokens(nil, []byte(prompt))); n < 3500 || n > 5000 {
		t.Fatalf("prompt has %d tokens, want about 4k", n)
	}
	body := `{"prompt":"` + prompt + `","stream":true}`
	_, cold := c.stream(e.URL()+"/v1/completions", body)
	_, warm := c.stream(e.URL()+"/v1/completions", body)
	if !cold.done || !warm.done {
		t.Fatalf("streams did not finish")
	}
	if cold.first <= 2*warm.first {
		t.Fatalf("cold TTFT %s is not > 2 x warm TTFT %s", cold.first, warm.first)
	}
}

func TestFaultErrorRate(t *testing.T) {
	cfg := testConfig()
	cfg.ErrorRate = 1
	e := startEngine(t, cfg)
	c := newClient(t, 10*time.Second)
	status, out := c.completion(e.URL()+"/v1/chat/completions", chatBody("x", ""))
	if status != 500 || out.Error == nil || out.Error.Type != "InternalServerError" || out.Error.Code != 500 {
		t.Fatalf("error fault: %d %+v", status, out.Error)
	}
	// Half the requests fail, deterministically; flipped on the running engine.
	if err := e.SetFaults(Faults{ErrorRate: 0.5}); err != nil {
		t.Fatal(err)
	}
	fails := 0
	for range 10 {
		if status, _ := c.completion(e.URL()+"/v1/completions", `{"prompt":"x"}`); status == 500 {
			fails++
		}
	}
	if fails != 5 {
		t.Fatalf("%d of 10 requests failed at rate 0.5", fails)
	}
	if err := e.SetFaults(Faults{ErrorRate: 2}); err == nil {
		t.Fatalf("SetFaults accepted an error rate of 2")
	}
}

func TestFaultAddedLatency(t *testing.T) {
	e := startEngine(t, testConfig())
	c := newClient(t, 10*time.Second)
	const added = 150 * time.Millisecond
	if err := e.SetFaults(Faults{AddedLatency: added}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if status, _ := c.completion(e.URL()+"/v1/completions", `{"prompt":"x"}`); status != 200 {
		t.Fatalf("status %d", status)
	}
	if d := time.Since(start); d < added {
		t.Fatalf("request took %s, less than the added %s", d, added)
	}
}

func TestFaultHangFreesSlotWhenClientLeaves(t *testing.T) {
	cfg := testConfig()
	cfg.HangBeforeHeaders = true
	cfg.MaxNumSeqs = 1
	e := startEngine(t, cfg)
	c := newClient(t, 300*time.Millisecond)
	done := make(chan error, 1)
	go func() {
		_, _, _, err := c.post(e.URL()+"/v1/completions", `{"prompt":"x"}`)
		done <- err
	}()
	eventually(t, "the hung request to take the slot", func() bool { return e.Stats().Running == 1 })
	if err := <-done; err == nil {
		t.Fatalf("hung request got an answer")
	}
	eventually(t, "the slot to be freed", func() bool { return e.Stats().Running == 0 })
	if st := e.Stats(); st.Disconnects != 1 {
		t.Fatalf("disconnects %d, want 1", st.Disconnects)
	}
	// Off again: the engine answers.
	if err := e.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	c2 := newClient(t, 10*time.Second)
	if status, _ := c2.completion(e.URL()+"/v1/completions", `{"prompt":"x"}`); status != 200 {
		t.Fatalf("status %d after the fault was cleared", status)
	}
}

func TestFaultAbortAfterChunks(t *testing.T) {
	cfg := testConfig()
	cfg.AbortAfterChunks = 2
	e := startEngine(t, cfg)
	c := newClient(t, 10*time.Second)
	_, s := c.stream(e.URL()+"/v1/chat/completions", chatBody("x", `,"stream":true,"max_tokens":8`))
	if s.done || len(s.events) != 2 {
		t.Fatalf("aborted stream: done %v, %d events", s.done, len(s.events))
	}
	eventually(t, "the slot to be freed", func() bool { return e.Stats().Running == 0 })
	if st := e.Stats(); st.Aborts != 1 {
		t.Fatalf("aborts %d", st.Aborts)
	}
	// A stream shorter than the limit is untouched.
	_, s = c.stream(e.URL()+"/v1/completions", `{"prompt":"x","stream":true,"max_tokens":1}`)
	if !s.done || len(s.events) != 1 {
		t.Fatalf("short stream: done %v, %d events", s.done, len(s.events))
	}
}

func TestStreamClientGoneFreesSlot(t *testing.T) {
	cfg := testConfig()
	cfg.DecodePerToken = 10 * time.Millisecond
	cfg.MaxTokens = 1000
	e := startEngine(t, cfg)
	conn, err := net.Dial("tcp", e.Addr())
	if err != nil {
		t.Fatal(err)
	}
	body := `{"prompt":"x","stream":true}`
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	buf := make([]byte, 4096)
	if _, err := conn.Read(buf); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the stream to run", func() bool { return e.Stats().Running == 1 })
	conn.Close()
	eventually(t, "the slot to be freed", func() bool { return e.Stats().Running == 0 })
	if st := e.Stats(); st.Disconnects != 1 || st.Completed != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestNonStreamClientGoneFreesSlot(t *testing.T) {
	cfg := testConfig()
	cfg.DecodePerToken = 10 * time.Millisecond
	cfg.MaxTokens = 1000 // 10s
	e := startEngine(t, cfg)
	c := newClient(t, 200*time.Millisecond)
	if _, _, _, err := c.post(e.URL()+"/v1/completions", `{"prompt":"x"}`); err == nil {
		t.Fatalf("a 10s request answered within the client's 200ms timeout")
	}
	eventually(t, "the slot to be freed", func() bool { return e.Stats().Running == 0 })
	if st := e.Stats(); st.Disconnects != 1 || st.Completed != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestStopLeavesNoGoroutines(t *testing.T) {
	// A first engine starts whatever lazily started global goroutines the libraries have.
	warm := startEngine(t, testConfig())
	c := newClient(t, 10*time.Second)
	c.completion(warm.URL()+"/v1/completions", `{"prompt":"warm"}`)
	warm.Stop()
	c.tr.CloseIdleConnections()
	eventually(t, "the first engine's goroutines to exit", func() bool { return engineGoroutines() == "" })
	base := runtime.NumGoroutine()

	cfg := testConfig()
	cfg.DecodePerToken = 5 * time.Millisecond
	if haveZMQ {
		cfg.KVEvents = "tcp://127.0.0.1:*"
		cfg.Replay = "tcp://127.0.0.1:*"
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	c.completion(e.URL()+"/v1/completions", `{"prompt":"`+words("stop", 100)+`"}`)
	c.stream(e.URL()+"/v1/completions", `{"prompt":"s","stream":true}`)
	// Requests still in flight at Stop: a long stream and a hung request.
	if err := e.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	inflight := newClient(t, 10*time.Second)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		inflight.stream(e.URL()+"/v1/completions", `{"prompt":"long","stream":true,"max_tokens":10000}`)
	}()
	eventually(t, "the long stream to run", func() bool { return e.Stats().Running == 1 })
	e.Stop()
	wg.Wait()
	c.tr.CloseIdleConnections()
	inflight.tr.CloseIdleConnections()
	n := 0
	deadline := time.Now().Add(5 * time.Second)
	for n = runtime.NumGoroutine(); n > base; n = runtime.NumGoroutine() {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after Stop, %d before Start:\n%s", n, base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.Stop() // idempotent
}

// engineGoroutines returns the stacks of goroutines running sim, fasthttp server or zmq code,
// except fasthttp's global date updater.
func engineGoroutines() string {
	buf := make([]byte, 1<<20)
	var out []string
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "updateServerDate") || strings.Contains(g, "sim.TestStop") {
			continue
		}
		if strings.Contains(g, "rolter/sim.") || strings.Contains(g, "fasthttp.") || strings.Contains(g, "zmq4.") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// TestStopRightAfterStart: Stop called before the Serve goroutine got going returns.
func TestStopRightAfterStart(t *testing.T) {
	for i := 0; i < 30; i++ {
		e, err := New(DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { e.Stop(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Stop hung right after Start")
		}
	}
}
