package telemetry

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fastjson"
)

// vllmModels is vLLM's GET /v1/models with two adapters loaded (--enable-lora --lora-modules, or
// POST /v1/load_lora_adapter).
const vllmModels = `{"object":"list","data":[
{"id":"Qwen/Qwen3-0.6B","object":"model","created":1795991206,"owned_by":"vllm","root":"Qwen/Qwen3-0.6B","parent":null,"max_model_len":40960,
 "permission":[{"id":"modelperm-1","object":"model_permission","created":1795991206,"allow_create_engine":false,"allow_sampling":true,"allow_logprobs":true,"allow_search_indices":false,"allow_view":true,"allow_fine_tuning":false,"organization":"*","group":null,"is_blocking":false}]},
{"id":"sql-lora","object":"model","created":1795991206,"owned_by":"vllm","root":"/adapters/sql-lora","parent":"Qwen/Qwen3-0.6B","max_model_len":null,"permission":[]},
{"id":"chat-lora","object":"model","created":1795991206,"owned_by":"vllm","root":"/adapters/chat","parent":"Qwen/Qwen3-0.6B","permission":[]}
]}`

func TestParseModelList(t *testing.T) {
	var p fastjson.Parser
	f := func(body string, base []string, adapters []AdapterCard) {
		t.Helper()
		ml, err := ParseModelList(&p, []byte(body))
		if err != nil || !slices.Equal(ml.Base, base) || !slices.Equal(ml.Adapters, adapters) {
			t.Fatalf("ParseModelList(%s) = %+v, %v; want base %q adapters %+v", body, ml, err, base, adapters)
		}
	}
	f(vllmModels, []string{"Qwen/Qwen3-0.6B"}, []AdapterCard{
		{Name: "sql-lora", Parent: "Qwen/Qwen3-0.6B", Root: "/adapters/sql-lora"},
		{Name: "chat-lora", Parent: "Qwen/Qwen3-0.6B", Root: "/adapters/chat"},
	})
	f(`{"object":"list","data":[]}`, nil, nil)
	f(`{"data":[{"id":"m"},{"id":"a","parent":"m"}]}`, []string{"m"}, []AdapterCard{{Name: "a", Parent: "m"}})
	f(`{"data":[{"id":"a","parent":"","root":null}]}`, []string{"a"}, nil) // an empty parent is no parent

	bad := func(body, want string) {
		t.Helper()
		_, err := ParseModelList(&p, []byte(body))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("ParseModelList(%.80s) error = %v; want one containing %q", body, err, want)
		}
	}
	bad(``, "cannot parse")
	bad(`<html>Bad Gateway</html>`, "cannot parse")
	bad(`{"data":[{"id":"a"}]`, "cannot parse")
	bad(`[]`, "JSON object")
	bad(`{"object":"list"}`, `"data" must be an array`)
	bad(`{"data":{"id":"a"}}`, `"data" must be an array`)
	bad(`{"data":["a"]}`, "card 0: it must be a JSON object")
	bad(`{"data":[{"object":"model"}]}`, `"id" must be a non-empty string`)
	bad(`{"data":[{"id":""}]}`, `"id" must be a non-empty string`)
	bad(`{"data":[{"id":7}]}`, `"id" must be a string or null`)
	bad(`{"data":[{"id":"a","parent":["m"]}]}`, `card "a": "parent" must be a string or null`)
	bad(`{"data":[{"id":"a","root":false}]}`, `card "a": "root" must be a string or null`)
	bad(`{"data":[{"id":"m"},{"id":"a","parent":"m"},{"id":"a","parent":"m"}]}`, `card 2: id "a" is listed twice`)
	bad(`{"data":[{"id":"`+strings.Repeat("x", MaxAdapterNameLen+1)+`"}]}`, fmt.Sprintf("more than %d", MaxAdapterNameLen))
	bad(`{"data":[{"id":"a","parent":"`+strings.Repeat("x", MaxAdapterNameLen+1)+`"}]}`, `"parent" is 257 bytes`)
	bad(`{"data":[`+strings.Repeat(`{"id":"a"},`, MaxModelCards)+`{"id":"b"}]}`, fmt.Sprintf("%d cards, more than %d", MaxModelCards+1, MaxModelCards))
	bad(strings.Repeat("[", 10000)+strings.Repeat("]", 10000), "cannot parse")
}

func TestModelsConfigValidate(t *testing.T) {
	c := ModelsConfig{BaseURL: "http://127.0.0.1:8000/"}
	if u, err := c.URL(); err != nil || u != "http://127.0.0.1:8000/v1/models" {
		t.Fatalf("URL() = %q, %v", u, err)
	}
	c = ModelsConfig{BaseURL: "ftp://h", Path: "v1/models", Interval: -1}
	err := c.Validate()
	for _, w := range []string{"scheme", "interval -1ns"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Fatalf("Validate() = %v; want it to mention %q", err, w)
		}
	}
	c = ModelsConfig{BaseURL: "http://h", Path: "v1/models"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "models path") {
		t.Fatalf("Validate() = %v; want a models path error", err)
	}
}

func TestModelsPoller(t *testing.T) {
	ms, base := newMetricsServer(t, []byte(vllmModels))
	var a Adapters
	mp := NewModelsPoller(ModelsConfig{
		BaseURL: base + "/engine-0",
		Timeout: 5 * time.Second,
		Headers: map[string]string{"Authorization": "Bearer secret"},
	}, &a, discardLogger)
	defer mp.Stop()
	maxAge := int64(time.Minute)

	mp.p.pollOnce()
	v := a.View(time.Now().UnixNano(), maxAge)
	if !v.ModelsKnown || !slices.Equal(v.Registered, []string{"chat-lora", "sql-lora"}) {
		t.Fatalf("View = %+v after a good poll; want chat-lora and sql-lora (stats %+v)", v, mp.Stats())
	}
	if !a.Registered("sql-lora", time.Now().UnixNano(), maxAge) || a.Registered("Qwen/Qwen3-0.6B", time.Now().UnixNano(), maxAge) {
		t.Fatalf("Registered: an adapter is missing or the base model counts as one")
	}
	ms.mu.Lock()
	path, auth := ms.lastPath, ms.lastAuth
	ms.mu.Unlock()
	if path != "/engine-0/v1/models" || auth != "Bearer secret" {
		t.Fatalf("server saw path %q auth %q", path, auth)
	}

	// A hostile body: the poll fails with a clear error and the view is dropped, not kept.
	hostile := []byte(`{"object":"list","data":[{"id":"a","parent":"m"},{"id":"a","parent":"m"}]}`)
	ms.body.Store(&hostile)
	mp.p.pollOnce()
	if v := a.View(time.Now().UnixNano(), maxAge); v.ModelsKnown || v.Registered != nil {
		t.Fatalf("View = %+v after a hostile body; want unknown", v)
	}
	st := mp.Stats()
	if st.OK != 1 || st.Failed != 1 || st.LastError == nil || !strings.Contains(st.LastError.Error(), `id "a" is listed twice`) {
		t.Fatalf("Stats = %+v; want 1 ok and 1 failed for the duplicate id", st)
	}

	// Recovery, then a 500.
	good := []byte(vllmModels)
	ms.body.Store(&good)
	mp.p.pollOnce()
	if !a.Registered("chat-lora", time.Now().UnixNano(), maxAge) {
		t.Fatalf("no recovery after a good body (stats %+v)", mp.Stats())
	}
	ms.status.Store(500)
	mp.p.pollOnce()
	if a.Registered("chat-lora", time.Now().UnixNano(), maxAge) || a.View(time.Now().UnixNano(), maxAge).ModelsKnown {
		t.Fatalf("model list kept after a 500")
	}
	st = mp.Stats()
	if st.OK != 2 || st.Failed != 2 || st.LastError == nil || !strings.Contains(st.LastError.Error(), "status code 500") {
		t.Fatalf("Stats = %+v; want 2 ok, 2 failed with status 500", st)
	}

	// A body over MaxBodySize fails too.
	ms.status.Store(200)
	small := NewModelsPoller(ModelsConfig{BaseURL: base, MaxBodySize: 64, Timeout: 5 * time.Second}, &a, discardLogger)
	defer small.Stop()
	small.p.pollOnce()
	if st := small.Stats(); st.Failed != 1 || st.LastError == nil {
		t.Fatalf("Stats = %+v; want a failure for a body over 64 bytes", st)
	}
}

func TestModelsPollerStartStop(t *testing.T) {
	_, base := newMetricsServer(t, []byte(vllmModels))
	var a Adapters
	mp := NewModelsPoller(ModelsConfig{BaseURL: base, Interval: 10 * time.Millisecond, Timeout: 5 * time.Second}, &a, discardLogger)
	mp.Start()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // a reader concurrent with the poll goroutine (for -race)
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			a.Lookup([]byte("sql-lora"), time.Now().UnixNano(), int64(time.Minute))
			_ = a.View(time.Now().UnixNano(), int64(time.Minute))
		}
	}()
	waitFor(t, "three polls", func() bool { return mp.Stats().OK >= 3 })
	close(stop)
	<-done
	mp.Stop()
	mp.Stop()
	if !a.Registered("sql-lora", time.Now().UnixNano(), int64(time.Minute)) {
		t.Fatalf("Stop dropped the last good model list")
	}
}
