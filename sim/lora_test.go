package sim

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"
)

// loraConfig is a fast engine serving adapters a, b and c in slots GPU slots.
func loraConfig(slots int) Config {
	cfg := testConfig()
	cfg.EnableLoRA = true
	cfg.MaxLoRAs = slots
	cfg.LoRAModules = []LoRAModule{{"a", "/adapters/a"}, {"b", "/adapters/b"}, {"c", "/adapters/c"}}
	return cfg
}

func loraBody(model, prompt string, extra string) string {
	p, _ := json.Marshal(prompt)
	return `{"model":"` + model + `","prompt":` + string(p) + extra + `}`
}

func TestLoRAModelsAndRequests(t *testing.T) {
	e := startEngine(t, loraConfig(2))
	c := newClient(t, 10*time.Second)
	_, b := c.get(e.URL() + "/v1/models")
	var list struct {
		Data []map[string]any `json:"data"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatalf("cannot decode %s: %s", b, err)
	}
	if len(list.Data) != 4 {
		t.Fatalf("models %s", b)
	}
	f := func(i int, id, root string, parent any, maxLen any) {
		t.Helper()
		m := list.Data[i]
		if m["id"] != id || m["root"] != root || m["parent"] != parent || m["max_model_len"] != maxLen ||
			m["object"] != "model" || m["owned_by"] != "vllm" || m["created"] == nil {
			t.Fatalf("card %d: %v", i, m)
		}
	}
	f(0, "sim-model", "sim-model", nil, float64(32768))
	f(1, "a", "/adapters/a", "sim-model", nil)
	f(3, "c", "/adapters/c", "sim-model", nil)

	url := e.URL() + "/v1/completions"
	status, out := c.completion(url, loraBody("b", "hello", ""))
	if status != 200 || out.Model != "b" || out.Usage == nil {
		t.Fatalf("adapter request: %d %+v", status, out)
	}
	status, out = c.completion(e.URL()+"/v1/chat/completions", `{"model":"a","messages":[{"role":"user","content":"hi"}]}`)
	if status != 200 || out.Model != "a" {
		t.Fatalf("adapter chat request: %d %+v", status, out)
	}
	if status, rb := postRaw(c, e.URL()+"/v1/responses", `{"model":"c","input":"hi"}`); status != 200 || !bytes.Contains(rb, []byte(`"model":"c"`)) {
		t.Fatalf("adapter responses request: %d %s", status, rb)
	}
	status, out = c.completion(url, loraBody("z", "hello", ""))
	if status != 404 || out.Error == nil || out.Error.Message != "The model `z` does not exist." {
		t.Fatalf("unknown adapter: %d %+v", status, out)
	}
	if status, tb := postRaw(c, e.URL()+"/tokenize", loraBody("a", "hello", "")); status != 200 || !bytes.Contains(tb, []byte(`"count":`)) {
		t.Fatalf("tokenize with an adapter: %d %s", status, tb)
	}
	if st := e.Stats(); st.LoRALoads != 3 || st.LoRAEvictions != 1 || st.LoRASlots != 2 {
		t.Fatalf("stats %+v", st)
	}

	// Without --enable-lora an adapter's name is an unknown model.
	plain := startEngine(t, testConfig())
	status, out = c.completion(plain.URL()+"/v1/completions", loraBody("a", "hello", ""))
	if status != 404 || out.Error == nil || out.Error.Type != "NotFoundError" {
		t.Fatalf("adapter name without enable-lora: %d %+v", status, out)
	}
}

func postRaw(c *client, url, body string) (int, []byte) {
	c.t.Helper()
	status, _, b, err := c.post(url, body)
	if err != nil {
		c.t.Fatalf("POST %s: %s", url, err)
	}
	return status, b
}

func TestLoRARuntimeAPI(t *testing.T) {
	c := newClient(t, 10*time.Second)
	off := startEngine(t, loraConfig(1))
	if status, b := postRaw(c, off.URL()+"/v1/load_lora_adapter", `{"lora_name":"x","lora_path":"/x"}`); status != 404 || string(b) != `{"detail":"Not Found"}` {
		t.Fatalf("load without runtime updating: %d %s", status, b)
	}
	if status, _ := postRaw(c, off.URL()+"/v1/unload_lora_adapter", `{"lora_name":"a"}`); status != 404 {
		t.Fatalf("unload without runtime updating: %d", status)
	}

	cfg := loraConfig(1)
	cfg.AllowRuntimeLoRA = true
	cfg.LoRALoadDelay = 5 * time.Millisecond
	e := startEngine(t, cfg)
	load, unload := e.URL()+"/v1/load_lora_adapter", e.URL()+"/v1/unload_lora_adapter"
	f := func(url, body string, wantStatus int, wantBody, wantType string) {
		t.Helper()
		status, h, b, err := c.post(url, body)
		if err != nil {
			t.Fatal(err)
		}
		if status != wantStatus || string(b) != wantBody || !strings.HasPrefix(h.Get("Content-Type"), wantType) {
			t.Fatalf("POST %s %s: %d %q (%s), want %d %q (%s)", url, body, status, b, h.Get("Content-Type"), wantStatus, wantBody, wantType)
		}
	}
	const js, text = "application/json", "text/plain"
	f(load, `{"lora_name":"x"}`, 400, `{"error":{"message":"Both 'lora_name' and 'lora_path' must be provided.","type":"InvalidUserInput","param":null,"code":400}}`, js)
	f(load, `{"lora_name":"a","lora_path":"/again"}`, 400, `{"error":{"message":"The lora adapter 'a' has already been loaded.","type":"InvalidUserInput","param":null,"code":400}}`, js)
	f(load, `{"lora_name":"x","lora_path":"/adapters/x"}`, 200, "Success: LoRA adapter 'x' added successfully.", text)
	f(load, `{"lora_name":"x","lora_path":"/adapters/x"}`, 400, `{"error":{"message":"The lora adapter 'x' has already been loaded.","type":"InvalidUserInput","param":null,"code":400}}`, js)
	if _, b := c.get(e.URL() + "/v1/models"); !bytes.Contains(b, []byte(`{"id":"x","object":"model"`)) || !bytes.Contains(b, []byte(`"root":"/adapters/x","parent":"sim-model","max_model_len":null}`)) {
		t.Fatalf("models lack the loaded adapter: %s", b)
	}
	if status, out := c.completion(e.URL()+"/v1/completions", loraBody("x", "hello", "")); status != 200 || out.Model != "x" {
		t.Fatalf("request to a loaded adapter: %d %+v", status, out)
	}
	f(unload, `{"lora_name":"x"}`, 200, "Success: LoRA adapter 'x' removed successfully.", text)
	f(unload, `{"lora_name":"x"}`, 404, `{"error":{"message":"The lora adapter 'x' cannot be found.","type":"NotFoundError","param":null,"code":404}}`, js)
	if status, _ := c.completion(e.URL()+"/v1/completions", loraBody("x", "hello", "")); status != 404 {
		t.Fatalf("request to an unloaded adapter: %d", status)
	}
	if _, b := c.get(e.URL() + "/v1/models"); bytes.Contains(b, []byte(`"x"`)) {
		t.Fatalf("models still list the unloaded adapter: %s", b)
	}
	st := e.Stats()
	if st.LoRAAPILoads != 1 || st.LoRAAPIUnloads != 1 || st.LoRASlots != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLoRASlotsEvictLeastRecentlyUsed(t *testing.T) {
	e := startEngine(t, loraConfig(2))
	c := newClient(t, 10*time.Second)
	f := func(model string, wantLoads, wantEvictions uint64) {
		t.Helper()
		if status, out := c.completion(e.URL()+"/v1/completions", loraBody(model, "hi", "")); status != 200 {
			t.Fatalf("%s: %d %+v", model, status, out)
		}
		if st := e.Stats(); st.LoRALoads != wantLoads || st.LoRAEvictions != wantEvictions {
			t.Fatalf("after %s: %d loads, %d evictions; want %d, %d", model, st.LoRALoads, st.LoRAEvictions, wantLoads, wantEvictions)
		}
	}
	f("a", 1, 0)
	f("b", 2, 0)
	f("a", 2, 0)
	f("sim-model", 2, 0) // the base model needs no slot
	f("c", 3, 1)         // evicts b, the least recently used
	f("a", 3, 1)         // still loaded
	f("b", 4, 2)         // evicts c
	f("a", 4, 2)
	m := c.metrics(e.URL())
	if m["rolter_sim_lora_loads_total"] != 4 || m["rolter_sim_lora_evictions_total"] != 2 {
		t.Fatalf("metrics %v", m)
	}
}

// openStream starts a stream on a connection of its own and returns once its first event came,
// so the request runs; closing the connection ends it.
func openStream(t *testing.T, e *Engine, body string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", e.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	return conn
}

// waitStreamStart reads from conn until the first event arrived.
func waitStreamStart(t *testing.T, conn net.Conn) {
	t.Helper()
	buf := make([]byte, 4096)
	var got []byte
	for !bytes.Contains(got, []byte("data: ")) {
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("stream: %s", err)
		}
		got = append(got, buf[:n]...)
	}
}

var loraInfoLine = regexp.MustCompile(`(?m)^vllm:lora_requests_info\{max_lora="(\d+)",waiting_lora_adapters="([^"]*)",running_lora_adapters="([^"]*)"\} (\S+)$`)

// latestLoRAInfo returns the labels of the vllm:lora_requests_info series with the largest value.
func latestLoRAInfo(t *testing.T, c *client, e *Engine) (maxLoRA, waiting, running string) {
	t.Helper()
	_, b := c.get(e.URL() + "/metrics")
	best := -1.0
	for _, m := range loraInfoLine.FindAllSubmatch(b, -1) {
		v, err := strconv.ParseFloat(string(m[4]), 64)
		if err != nil {
			t.Fatalf("lora_requests_info value %q", m[4])
		}
		if v > best {
			best, maxLoRA, waiting, running = v, string(m[1]), string(m[2]), string(m[3])
		}
	}
	if best < 0 {
		t.Fatalf("no vllm:lora_requests_info in\n%s", b)
	}
	return maxLoRA, waiting, running
}

func TestLoRAWaitsForBusySlotWithoutStarving(t *testing.T) {
	cfg := loraConfig(1)
	cfg.DecodePerToken = 10 * time.Millisecond
	cfg.MaxTokens = 1000 // streams run 10s unless their client leaves
	cfg.LoRALoadDelay = 2 * time.Millisecond
	e := startEngine(t, cfg)
	c := newClient(t, 10*time.Second)

	a1 := openStream(t, e, loraBody("a", "first", `,"stream":true`))
	waitStreamStart(t, a1)
	if max, waiting, running := latestLoRAInfo(t, c, e); max != "1" || waiting != "" || running != "a" {
		t.Fatalf("lora_requests_info max %q waiting %q running %q", max, waiting, running)
	}

	// b needs the only slot, which a's stream holds: it waits.
	bDone := make(chan completion, 1)
	go func() {
		_, out := c.completion(e.URL()+"/v1/completions", loraBody("b", "second", `,"max_tokens":1`))
		bDone <- out
	}()
	eventually(t, "b to wait", func() bool { return e.Stats().Waiting == 1 })
	// A later request of a must not pass b, or a steady stream of a would keep b out.
	a2 := openStream(t, e, loraBody("a", "third", `,"stream":true`))
	eventually(t, "the second a to wait", func() bool { return e.Stats().Waiting == 2 })
	if _, waiting, running := latestLoRAInfo(t, c, e); waiting != "a,b" || running != "a" {
		t.Fatalf("lora_requests_info waiting %q running %q", waiting, running)
	}
	// The base model needs no slot: it runs past both.
	if status, out := c.completion(e.URL()+"/v1/completions", loraBody("sim-model", "base", `,"max_tokens":1`)); status != 200 {
		t.Fatalf("base request: %d %+v", status, out)
	}
	select {
	case out := <-bDone:
		t.Fatalf("b ran while a held the slot: %+v", out)
	default:
	}

	a1.Close()
	select {
	case out := <-bDone:
		if out.Model != "b" || out.Usage == nil {
			t.Fatalf("b: %+v", out)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("b did not run after a's stream ended")
	}
	waitStreamStart(t, a2)
	if _, waiting, running := latestLoRAInfo(t, c, e); waiting != "" || running != "a" {
		t.Fatalf("lora_requests_info waiting %q running %q", waiting, running)
	}
	if st := e.Stats(); st.LoRALoads != 3 || st.LoRAEvictions != 2 || st.Waiting != 0 {
		t.Fatalf("stats %+v", st)
	}
	a2.Close()
	eventually(t, "the slot to be idle", func() bool { return e.Stats().Running == 0 })
}

func TestLoRAWaitingClientLeaves(t *testing.T) {
	cfg := loraConfig(1)
	cfg.DecodePerToken = 10 * time.Millisecond
	cfg.MaxTokens = 1000
	e := startEngine(t, cfg)
	a := openStream(t, e, loraBody("a", "first", `,"stream":true`))
	waitStreamStart(t, a)
	b := openStream(t, e, loraBody("b", "second", `,"stream":true`))
	eventually(t, "b to wait", func() bool { return e.Stats().Waiting == 1 })
	b.Close()
	eventually(t, "b to leave the queue", func() bool { return e.Stats().Waiting == 0 })
	// With nobody held back, a's adapter is not draining: another a request runs at once.
	a2 := openStream(t, e, loraBody("a", "third", `,"stream":true`))
	waitStreamStart(t, a2)
	if st := e.Stats(); st.Running != 2 || st.LoRALoads != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLoRAConcurrentFirstRequestsLoadOnce(t *testing.T) {
	cfg := loraConfig(1)
	cfg.LoRALoadDelay = 50 * time.Millisecond
	e := startEngine(t, cfg)
	c := newClient(t, 10*time.Second)
	var wg sync.WaitGroup
	statuses := make([]int, 8)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i], _ = c.completion(e.URL()+"/v1/completions", loraBody("a", "hello "+strconv.Itoa(i), ""))
		}()
	}
	wg.Wait()
	for i, s := range statuses {
		if s != 200 {
			t.Fatalf("request %d: %d", i, s)
		}
	}
	if st := e.Stats(); st.LoRALoads != 1 || st.Completed != 8 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLoRAPrefixCacheIsPerAdapter(t *testing.T) {
	e := startEngine(t, loraConfig(2))
	c := newClient(t, 10*time.Second)
	prompt := words("adapter", 200)
	f := func(model string, wantHit bool) {
		t.Helper()
		status, out := c.completion(e.URL()+"/v1/completions", loraBody(model, prompt, ""))
		if status != 200 {
			t.Fatalf("%s: %d %+v", model, status, out)
		}
		if got := out.Usage.PromptTokensDetails.CachedTokens; (got > 0) != wantHit {
			t.Fatalf("%s: cached_tokens %d, want a hit: %v", model, got, wantHit)
		}
	}
	f("sim-model", false)
	f("sim-model", true)
	f("a", false) // the base model's blocks are not a's
	f("a", true)
	f("b", false)
	f("b", true)
}

func TestLoRABlockHashAndEvents(t *testing.T) {
	tokens := make([]uint32, 16)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	// cbor2.dumps((NONE_HASH, (1, ..., 16), ("a",)), canonical=True)
	want := "8358204e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e900102030405060708090a0b0c0d0e0f10816161"
	if got := hex.EncodeToString(appendBlockCBOR(nil, &noneHash, tokens, "a")); got != want {
		t.Fatalf("adapter block CBOR:\ngot  %s\nwant %s", got, want)
	}
	base, _ := appendBlockHashes(nil, nil, tokens, 16, "")
	a, _ := appendBlockHashes(nil, nil, tokens, 16, "a")
	b, _ := appendBlockHashes(nil, nil, tokens, 16, "b")
	if base[0] == a[0] || a[0] == b[0] {
		t.Fatalf("adapter blocks share hashes: %x %x %x", base[0], a[0], b[0])
	}

	f := func(era Era, want ...string) {
		t.Helper()
		ev := &storedEvent{hashes: a, tokens: tokens, blockSize: 16, loraID: 3, loraName: "a"}
		var js bytes.Buffer
		if _, err := msgp.UnmarshalAsJSON(&js, appendBlockStored(nil, eraFormats[era], HashInt, ev)); err != nil {
			t.Fatalf("era %s: %s", era, err)
		}
		for _, w := range want {
			if !strings.Contains(js.String(), w) {
				t.Fatalf("era %s: %s lacks %s", era, js.String(), w)
			}
		}
	}
	f(EraMap, `"lora_id":3`, `"lora_name":"a"`, `"extra_keys":[["a"]]`)
	f(EraLoraName, `16,3,"GPU","a"]`)
	f(EraMedium, `16,3,"GPU"]`)
}

func TestLoRAMixedLoadDrains(t *testing.T) {
	cfg := loraConfig(2)
	cfg.MaxNumSeqs = 4
	cfg.DecodePerToken = time.Millisecond
	cfg.LoRALoadDelay = 3 * time.Millisecond
	e := startEngine(t, cfg)
	c := newClient(t, 20*time.Second)
	models := []string{"a", "b", "c", "sim-model"}
	var wg sync.WaitGroup
	statuses := make([]int, 80)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i], _ = c.completion(e.URL()+"/v1/completions", loraBody(models[i*7%len(models)], "p "+strconv.Itoa(i%5), ""))
		}()
	}
	wg.Wait()
	for i, s := range statuses {
		if s != 200 {
			t.Fatalf("request %d: %d", i, s)
		}
	}
	st := e.Stats()
	if st.Running != 0 || st.Waiting != 0 || st.LoRASlots > 2 || st.LoRALoads < 3 || st.LoRALoads != st.LoRAEvictions+uint64(st.LoRASlots) {
		t.Fatalf("stats %+v", st)
	}
	e.mu.Lock()
	blocked, drain := e.lora.blocked, e.lora.drain
	e.mu.Unlock()
	if blocked != 0 || drain != nil {
		t.Fatalf("after the load: %d requests marked held back, draining %v", blocked, drain)
	}
}
