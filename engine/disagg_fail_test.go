package engine

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// Fake prefill and decode engines, answering as vLLM's do with the NixlConnector, so each failure of the
// protocol can be staged. Every request each receives is kept.

// pdEngine is a fake engine: its bodies, X-Request-Ids and handler.
type pdEngine struct {
	*fakeUpstream
	mu     sync.Mutex
	bodies []map[string]any
	ids    []string
}

func (e *pdEngine) got() ([]map[string]any, []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]map[string]any(nil), e.bodies...), append([]string(nil), e.ids...)
}

// newPDEngine starts a fake engine running h after it recorded the request.
func newPDEngine(t *testing.T, h http.HandlerFunc) *pdEngine {
	e := &pdEngine{}
	e.fakeUpstream = newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Errorf("engine got a body that is not JSON: %s: %s", err, b)
		}
		e.mu.Lock()
		e.bodies = append(e.bodies, m)
		e.ids = append(e.ids, r.Header.Get("X-Request-Id"))
		e.mu.Unlock()
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		h(w, r)
	})
	return e
}

// prefillOK answers a prefill request as vLLM's NixlConnector does: one token, and where the blocks are.
func prefillOK(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-p","object":"chat.completion","model":"pm","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"length"}],`+
			`"usage":{"prompt_tokens":300,"completion_tokens":1,"total_tokens":301,"prompt_tokens_details":{"cached_tokens":128}},`+
			`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2,3],"remote_engine_id":"engine-%s","remote_request_id":"req-%s","remote_host":"10.0.0.1","remote_port":5600,"tp_size":1}}`, name, name)
	}
}

// decodeOK answers the client's request as a decode engine: streamed (a role chunk, two tokens, usage,
// [DONE]) or whole, with usage counting the received blocks as cached.
func decodeOK(w http.ResponseWriter, r *http.Request) {
	var req struct{ Stream bool }
	b, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(b, &req)
	usage := `{"prompt_tokens":300,"completion_tokens":2,"total_tokens":302,"prompt_tokens_details":{"cached_tokens":299}}`
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-d","object":"chat.completion","model":"dm","choices":[{"index":0,"message":{"role":"assistant","content":"ab"},"finish_reason":"length"}],"usage":%s}`, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for _, ev := range []string{
		`{"id":"chatcmpl-d","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-d","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-d","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"b"},"logprobs":null,"finish_reason":"length"}]}`,
		`{"id":"chatcmpl-d","object":"chat.completion.chunk","choices":[],"usage":` + usage + `}`,
		`[DONE]`,
	} {
		fmt.Fprintf(w, "data: %s\n\n", ev)
		fl.Flush()
	}
}

// kvLoadFailed is a decode engine whose pull failed under kv_load_failure_policy "fail": a 200 stream of
// the role chunk and an error event (vLLM's GenerationError), or a 500 when not streamed.
func kvLoadFailed(w http.ResponseWriter, r *http.Request) {
	var req struct{ Stream bool }
	b, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(b, &req)
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(500)
		fmt.Fprint(w, `{"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprint(w, `data: {"id":"chatcmpl-d","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n")
	w.(http.Flusher).Flush()
	time.Sleep(5 * time.Millisecond)
	fmt.Fprint(w, `data: {"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}`+"\n\ndata: [DONE]\n\n")
}

// pdFakes returns the config of route "m" disaggregated over prefill engines p0.. (upstream model "pm")
// and decode engines d0.. (model "dm"), with extra appended to the file's top (sections).
func pdFakes(prefill, decode []string, strategy, disagg, extra string) string {
	return pdConfig(prefill, decode, "pm", "dm", strategy, disagg, extra)
}

// pdConfig is pdFakes with the upstream models of each pool.
func pdConfig(prefill, decode []string, prefillModel, decodeModel, strategy, disagg, extra string) string {
	var b strings.Builder
	b.WriteString("[server]\nlisten = \"127.0.0.1:0\"\n" + extra + "\n")
	for i, u := range prefill {
		fmt.Fprintf(&b, "[[providers]]\nname = \"p%d\"\napi_base = %q\n", i, u)
	}
	for i, u := range decode {
		fmt.Fprintf(&b, "[[providers]]\nname = \"d%d\"\napi_base = %q\n", i, u)
	}
	fmt.Fprintf(&b, "[[routes]]\nmodel = \"m\"\nstrategy = %q\n", strategy)
	for i := range prefill {
		fmt.Fprintf(&b, "[[routes.targets]]\nprovider = \"p%d\"\nmodel = %q\n", i, prefillModel)
	}
	b.WriteString("[routes.disaggregation]\n" + disagg + "\n")
	for i := range decode {
		fmt.Fprintf(&b, "[[routes.disaggregation.decode]]\nprovider = \"d%d\"\nmodel = %q\n", i, decodeModel)
	}
	return b.String()
}

// proxyPrefill is what vLLM's reference proxy (toy_proxy_server.py, send_request_to_service) sends the
// prefill engine for the client's request req, decoded.
func proxyPrefill(req map[string]any) map[string]any {
	p := cloneMap(req)
	p["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	p["stream"] = false
	p["max_tokens"] = 1.0
	if _, ok := p["max_completion_tokens"]; ok {
		p["max_completion_tokens"] = 1.0
	}
	delete(p, "stream_options")
	delete(p, "min_tokens")
	delete(p, "min_completion_tokens")
	return p
}

func cloneMap(m map[string]any) map[string]any {
	b, _ := json.Marshal(m)
	var c map[string]any
	_ = json.Unmarshal(b, &c)
	return c
}

// sameAsProxy compares, key by key, what the gateway sent with what the proxy sends; a key the proxy
// deletes may be sent as vLLM's default for it (the gateway can only append members).
func sameAsProxy(t *testing.T, what string, got, want map[string]any) {
	t.Helper()
	defaults := map[string]any{"stream_options": nil, "min_tokens": 0.0, "min_completion_tokens": 0.0}
	for k, v := range got {
		w, ok := want[k]
		if !ok {
			if d, isDef := defaults[k]; !isDef || !reflect.DeepEqual(v, d) {
				t.Errorf("%s: key %q = %#v, which the proxy does not send", what, k, v)
			}
			continue
		}
		if !reflect.DeepEqual(v, w) {
			t.Errorf("%s: key %q = %#v, want %#v", what, k, v, w)
		}
	}
	for k, w := range want {
		if _, ok := got[k]; !ok {
			t.Errorf("%s: key %q missing, want %#v", what, k, w)
		}
	}
}

// TestDisaggWire checks both hops field by field against vLLM's proxy, for chat and completions, streamed
// or not, with the keys the proxy treats specially, a client-supplied kv_transfer_params (which must never
// reach an engine) and the model name rewritten per pool.
func TestDisaggWire(t *testing.T) {
	p := newPDEngine(t, prefillOK("p0"))
	d := newPDEngine(t, decodeOK)
	logPath := filepath.Join(t.TempDir(), "access.log")
	gw := startGateway(t, pdFakes([]string{p.URL}, []string{d.URL}, "cache_aware", "prefill_threshold_tokens = 0",
		fmt.Sprintf("[log]\naccess = %q\n", logPath)))
	long := strings.Repeat("word ", 50)
	for i, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"` + long + `"}]}`},
		{"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":64,"min_tokens":4,"temperature":0.5,"messages":[{"role":"user","content":"` + long + `"}]}`},
		{"/v1/chat/completions", `{"model":"m","max_completion_tokens":32,"min_completion_tokens":2,"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"evil.example","remote_port":1},"messages":[{"role":"user","content":"` + long + `"}]}`},
		{"/v1/completions", `{"model":"m","prompt":"` + long + `","max_tokens":16,"stream":true}`},
		{"/v1/completions", `{ "model" : "m" , "prompt" : ["` + long + `"] , "echo" : false }  `},
	} {
		resp, out := post(t, gw.URL+tc.path, tc.body)
		if resp.StatusCode != 200 {
			t.Fatalf("case %d: %d %s", i, resp.StatusCode, out)
		}
		var client map[string]any
		if err := json.Unmarshal([]byte(tc.body), &client); err != nil {
			t.Fatal(err)
		}
		pb, pids := p.got()
		db, dids := d.got()
		if len(pb) != i+1 || len(db) != i+1 {
			t.Fatalf("case %d: prefill got %d, decode %d requests", i, len(pb), len(db))
		}
		wantP := proxyPrefill(client)
		wantP["model"] = "pm"
		sameAsProxy(t, fmt.Sprintf("case %d prefill", i), pb[i], wantP)
		// The decode request is the client's, with the prefill answer's params copied in as they came.
		wantD := cloneMap(client)
		wantD["model"] = "dm"
		wantD["kv_transfer_params"] = map[string]any{"do_remote_prefill": true, "do_remote_decode": false,
			"remote_block_ids": []any{1.0, 2.0, 3.0}, "remote_engine_id": "engine-p0", "remote_request_id": "req-p0",
			"remote_host": "10.0.0.1", "remote_port": 5600.0, "tp_size": 1.0}
		sameAsProxy(t, fmt.Sprintf("case %d decode", i), db[i], wantD)
		if pids[i] == "" || pids[i] != dids[i] || pids[i] != resp.Header.Get("X-Request-Id") {
			t.Errorf("case %d: X-Request-Id prefill %q, decode %q, answer %q; want one id", i, pids[i], dids[i], resp.Header.Get("X-Request-Id"))
		}
		if strings.Contains(out, `"cached_tokens":299`) || !strings.Contains(out, `"cached_tokens":128`) {
			t.Errorf("case %d: the answer's cached_tokens are not the prefill engine's: %s", i, out)
		}
	}
	// The access log names both engines.
	waitFor(t, 5*time.Second, "the access log", func() bool { raw, _ := os.ReadFile(logPath); return strings.Count(string(raw), "\n") >= 5 })
	for _, l := range accessLines(t, logPath) {
		if l["target"] != "d0" || l["prefill_target"] != "p0" || l["cached_tokens"] != 128.0 {
			t.Fatalf("access log line %v: want target d0, prefill_target p0, cached_tokens 128", l)
		}
	}
}

// countOf returns how many requests each engine received.
func countOf(es ...*pdEngine) []int {
	var n []int
	for _, e := range es {
		b, _ := e.got()
		n = append(n, len(b))
	}
	return n
}

func decodeParams(t *testing.T, e *pdEngine, i int) any {
	t.Helper()
	b, _ := e.got()
	if i >= len(b) {
		t.Fatalf("decode engine got %d requests, want > %d", len(b), i)
	}
	return b[i]["kv_transfer_params"]
}

func TestDisaggPrefillFails(t *testing.T) {
	long := chatBody("m", strings.Repeat("word ", 300), false)
	t.Run("5xx moves to the next prefill engine", func(t *testing.T) {
		bad := newPDEngine(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", 500) })
		good := newPDEngine(t, prefillOK("p1"))
		d := newPDEngine(t, decodeOK)
		gw := startGateway(t, pdFakes([]string{bad.URL, good.URL}, []string{d.URL}, "round_robin", "", ""))
		for range 2 {
			resp, out := post(t, gw.URL+"/v1/chat/completions", long)
			if resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Prefill-Target") != "p1" {
				t.Fatalf("%d prefill=%q %s", resp.StatusCode, resp.Header.Get("X-Rolter-Prefill-Target"), out)
			}
		}
		if kv, _ := decodeParams(t, d, 0).(map[string]any); kv["remote_engine_id"] != "engine-p1" {
			t.Fatalf("decode got params %v, want p1's", kv)
		}
	})
	t.Run("a timeout moves to the next prefill engine", func(t *testing.T) {
		slow := newPDEngine(t, func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		})
		good := newPDEngine(t, prefillOK("p1"))
		d := newPDEngine(t, decodeOK)
		gw := startGateway(t, pdFakes([]string{slow.URL, good.URL}, []string{d.URL}, "least_load", "", "[timeouts]\nheaders_secs = 0.3\n"))
		resp, out := post(t, gw.URL+"/v1/chat/completions", long)
		if resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Prefill-Target") != "p1" {
			t.Fatalf("%d prefill=%q %s", resp.StatusCode, resp.Header.Get("X-Rolter-Prefill-Target"), out)
		}
	})
	t.Run("a 4xx is the client's", func(t *testing.T) {
		p := newPDEngine(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(400)
			fmt.Fprint(w, `{"error":{"message":"bad temperature","type":"BadRequestError","param":"temperature","code":400}}`)
		})
		d := newPDEngine(t, decodeOK)
		gw := startGateway(t, pdFakes([]string{p.URL}, []string{d.URL}, "round_robin", "", ""))
		resp, out := post(t, gw.URL+"/v1/chat/completions", long)
		if resp.StatusCode != 400 || !strings.Contains(out, "bad temperature") {
			t.Fatalf("%d %s", resp.StatusCode, out)
		}
		if n := countOf(p, d); n[0] != 1 || n[1] != 0 {
			t.Fatalf("requests prefill %d, decode %d; want 1, 0", n[0], n[1])
		}
	})
	t.Run("no prefill engine answers: the decode engine prefills", func(t *testing.T) {
		d := newPDEngine(t, decodeOK)
		gw := startGateway(t, pdFakes([]string{"http://" + deadAddr(t)}, []string{d.URL}, "round_robin", "", ""))
		resp, out := post(t, gw.URL+"/v1/chat/completions", long)
		if resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Prefill-Skipped") != "prefill_failed" {
			t.Fatalf("%d skipped=%q %s", resp.StatusCode, resp.Header.Get("X-Rolter-Prefill-Skipped"), out)
		}
		if kv := decodeParams(t, d, 0); kv != nil {
			t.Fatalf("decode got kv_transfer_params %v, want null", kv)
		}
	})
	t.Run("an answer without params: the decode engine prefills", func(t *testing.T) {
		p := newPDEngine(t, okJSON) // a prefill that stopped on its first token keeps no blocks
		d := newPDEngine(t, decodeOK)
		gw := startGateway(t, pdFakes([]string{p.URL}, []string{d.URL}, "round_robin", "", ""))
		if resp, out := post(t, gw.URL+"/v1/chat/completions", long); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, out)
		}
		if kv := decodeParams(t, d, 0); kv != nil {
			t.Fatalf("decode got kv_transfer_params %v, want null", kv)
		}
	})
	t.Run("hostile params are refused", func(t *testing.T) {
		bad := newPDEngine(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"kv_transfer_params":"},\"x\":{"}`)
		})
		good := newPDEngine(t, prefillOK("p1"))
		d := newPDEngine(t, decodeOK)
		gw := startGateway(t, pdFakes([]string{bad.URL, good.URL}, []string{d.URL}, "round_robin", "", ""))
		for range 2 {
			if resp, out := post(t, gw.URL+"/v1/chat/completions", long); resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Prefill-Target") != "p1" {
				t.Fatalf("%d %s", resp.StatusCode, out)
			}
		}
	})
}

func TestDisaggDecodeFails(t *testing.T) {
	long := strings.Repeat("word ", 300)
	t.Run("not reached: another decode engine, the same params", func(t *testing.T) {
		p := newPDEngine(t, prefillOK("p0"))
		d := newPDEngine(t, decodeOK)
		gw := startGateway(t, pdFakes([]string{p.URL}, []string{"http://" + deadAddr(t), d.URL}, "round_robin", "", ""))
		for range 3 {
			if resp, out := post(t, gw.URL+"/v1/chat/completions", chatBody("m", long, false)); resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, out)
			}
		}
		if n := countOf(p, d); n[0] != 3 || n[1] != 3 {
			t.Fatalf("requests prefill %d, decode %d; want 3, 3 (no fresh prefill for an engine that got nothing)", n[0], n[1])
		}
	})
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("reached, stream=%v: a fresh prefill, then another decode engine", stream), func(t *testing.T) {
			p := newPDEngine(t, prefillOK("p0"))
			bad := newPDEngine(t, kvLoadFailed)
			good := newPDEngine(t, decodeOK)
			gw := startGateway(t, pdFakes([]string{p.URL}, []string{bad.URL, good.URL}, "round_robin", "", ""))
			// The decode pick breaks ties at random: requests go until one was sent to the failing engine
			// first (half of them, on average).
			sent := 0
			for countOf(bad)[0] == 0 && sent < 50 {
				sent++
				resp, out := post(t, gw.URL+"/v1/chat/completions", chatBody("m", long, stream))
				if resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Target") != "d1" {
					t.Fatalf("%d target=%q %s", resp.StatusCode, resp.Header.Get("X-Rolter-Target"), out)
				}
				if strings.Contains(out, "error") {
					t.Fatalf("the failed decode's error reached the client: %s", out)
				}
				if stream && !strings.Contains(out, "data: [DONE]") {
					t.Fatalf("stream: %s", out)
				}
			}
			if n := countOf(p, bad, good); n[0] != sent+1 || n[1] != 1 || n[2] != sent {
				t.Fatalf("after %d requests: prefill %d, failing decode %d, good decode %d; want %d, 1, %d", sent, n[0], n[1], n[2], sent+1, sent)
			}
		})
	}
	t.Run("after the first byte: the SSE error event", func(t *testing.T) {
		p := newPDEngine(t, prefillOK("p0"))
		d := newPDEngine(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n")
			w.(http.Flusher).Flush()
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		})
		gw := startGateway(t, pdFakes([]string{p.URL}, []string{d.URL}, "round_robin", "", ""))
		resp, out := post(t, gw.URL+"/v1/chat/completions", chatBody("m", long, true))
		if resp.StatusCode != 200 || !strings.Contains(out, `"content":"a"`) || !strings.Contains(out, `data: {"error"`) || strings.Contains(out, "[DONE]") {
			t.Fatalf("%d %s", resp.StatusCode, out)
		}
		if n := countOf(p, d); n[0] != 1 || n[1] != 1 {
			t.Fatalf("requests prefill %d, decode %d; want 1, 1", n[0], n[1])
		}
	})
}

// TestDisaggNoDoubleDelivery: under failures everywhere, no decode engine ever gets one request twice.
func TestDisaggNoDoubleDelivery(t *testing.T) {
	p := newPDEngine(t, prefillOK("p0"))
	var ds []*pdEngine
	var urls []string
	for range 3 {
		d := newPDEngine(t, kvLoadFailed)
		ds = append(ds, d)
		urls = append(urls, d.URL)
	}
	gw := startGateway(t, pdFakes([]string{p.URL}, urls, "round_robin", "", "[retry]\nmax_retries = 5\n[cooldown]\nfailures = 100\n"))
	resp, out := post(t, gw.URL+"/v1/chat/completions", chatBody("m", strings.Repeat("word ", 300), true))
	if resp.StatusCode != 502 {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	for i, d := range ds {
		_, ids := d.got()
		if len(ids) != 1 {
			t.Fatalf("decode engine %d got %d requests, want exactly 1", i, len(ids))
		}
	}
}

func TestDisaggSkips(t *testing.T) {
	p := newPDEngine(t, prefillOK("p0"))
	d := newPDEngine(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/embeddings") {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],"usage":{"prompt_tokens":2,"total_tokens":2}}`)
			return
		}
		decodeOK(w, r)
	})
	gw := startGateway(t, pdFakes([]string{p.URL}, []string{d.URL}, "round_robin", "prefill_threshold_tokens = 256", ""))
	for _, tc := range []struct{ path, body, reason string }{
		{"/v1/chat/completions", chatBody("m", "hi", false), "short_prompt"},
		{"/v1/embeddings", `{"model":"m","input":"` + strings.Repeat("word ", 300) + `"}`, "endpoint"},
	} {
		resp, out := post(t, gw.URL+tc.path, tc.body)
		if resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Prefill-Skipped") != tc.reason || resp.Header.Get("X-Rolter-Prefill-Target") != "" {
			t.Fatalf("%s: %d skipped=%q %s", tc.path, resp.StatusCode, resp.Header.Get("X-Rolter-Prefill-Skipped"), out)
		}
	}
	if n := countOf(p, d); n[0] != 0 || n[1] != 2 {
		t.Fatalf("requests prefill %d, decode %d; want 0, 2", n[0], n[1])
	}
	if kv := decodeParams(t, d, 0); kv != nil {
		t.Fatalf("a skipped request's decode got kv_transfer_params %v, want null", kv)
	}
}

// TestDisaggClientLeaves: a client that leaves closes the hop in flight, which aborts it on its engine,
// and the other hop is never sent.
func TestDisaggClientLeaves(t *testing.T) {
	hang := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	long := chatBody("m", strings.Repeat("word ", 300), true)
	for _, during := range []string{"prefill", "decode"} {
		t.Run(during, func(t *testing.T) {
			ph, dh := prefillOK("p0"), http.HandlerFunc(hang)
			if during == "prefill" {
				ph, dh = hang, decodeOK
			}
			p, d := newPDEngine(t, ph), newPDEngine(t, dh)
			gw := startGateway(t, pdFakes([]string{p.URL}, []string{d.URL}, "round_robin", "", ""))
			conn, err := net.Dial("tcp", gw.addr)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(long), long)
			busy := p
			if during == "decode" {
				busy = d
			}
			waitFor(t, 5*time.Second, "the hop to reach its engine", func() bool { return busy.requests.Load() == 1 })
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
			select {
			case <-busy.gone:
			case <-time.After(5 * time.Second):
				t.Fatalf("the %s engine's request was not cancelled", during)
			}
			if during == "prefill" {
				time.Sleep(100 * time.Millisecond)
				if n := d.requests.Load(); n != 0 {
					t.Fatalf("the decode engine got %d requests after the client left during the prefill", n)
				}
			}
		})
	}
}
