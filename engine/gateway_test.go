package engine

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
)

func TestProxyChatCompletion(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGateway(t, gatewayConfig("round_robin", "", up.URL))

	body := `{"model" : "m","messages":[{"role":"user","content":"caf\u00e9 \"quoted\""}],"temperature":0.5}`
	resp, got := post(t, gw.URL+"/v1/chat/completions", body, "X-Request-Id", "req-42", "Authorization", "Bearer client-key", "X-Custom", "v")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	if !strings.Contains(got, `"content":"hi"`) {
		t.Fatalf("unexpected body %s", got)
	}
	f := func(h, want string) {
		t.Helper()
		if v := resp.Header.Get(h); v != want {
			t.Fatalf("header %s = %q, want %q", h, v, want)
		}
	}
	f("X-Request-Id", "req-42")
	f("X-Rolter-Route", "m")
	f("X-Rolter-Target", "p0")
	f("X-Rolter-Provider", "p0")
	f("X-Rolter-Strategy", "round_robin")
	f("X-Rolter-Decision", "round_robin")
	f("Content-Type", "application/json")

	upBody, upHdr := up.last()
	// Only the model value changes; everything else is forwarded byte for byte.
	if want := `{"model" : "up-model","messages":[{"role":"user","content":"caf\u00e9 \"quoted\""}],"temperature":0.5}`; upBody != want {
		t.Fatalf("upstream body\n got %s\nwant %s", upBody, want)
	}
	if upHdr.Get("X-Request-Id") != "req-42" || upHdr.Get("Authorization") != "Bearer client-key" || upHdr.Get("X-Custom") != "v" {
		t.Fatalf("headers not forwarded: %v", upHdr)
	}
	if upHdr.Get("Connection") == "close" {
		t.Fatalf("upstream connection should be kept alive")
	}
}

func TestProxyProviderKeyAndHeaders(t *testing.T) {
	t.Setenv("ROLTER_TEST_KEY", "sk-upstream")
	up := newFakeUpstream(t, okJSON)
	cfg := fmt.Sprintf(`[server]
listen = "127.0.0.1:0"
[[providers]]
name = "p0"
api_base = "%s/v1"
api_key_env = "ROLTER_TEST_KEY"
headers = { "X-Team" = "search" }
[[routes]]
model = "m"
[[routes.targets]]
provider = "p0"
`, up.URL)
	gw := startGateway(t, cfg)
	resp, got := post(t, gw.URL+"/v1/completions", `{"model":"m","prompt":"hello"}`, "Authorization", "Bearer client-key")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	upBody, hdr := up.last()
	if hdr.Get("Authorization") != "Bearer sk-upstream" || hdr.Get("X-Team") != "search" {
		t.Fatalf("provider key/headers not applied: %v", hdr)
	}
	if upBody != `{"model":"m","prompt":"hello"}` {
		t.Fatalf("body changed although the target model equals the route model: %s", upBody)
	}
}

func TestProxyUpstreamPathWithV1Base(t *testing.T) {
	var path string
	var mu sync.Mutex
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		path = r.URL.RequestURI()
		mu.Unlock()
		okJSON(w, r)
	})
	gw := startGateway(t, gatewayConfig("round_robin", "", up.URL+"/v1"))
	post(t, gw.URL+"/v1/embeddings?x=1", `{"model":"m","input":"a"}`)
	mu.Lock()
	defer mu.Unlock()
	if path != "/v1/embeddings?x=1" {
		t.Fatalf("upstream path %q", path)
	}
}

// TestClientDisconnectMidStream: the upstream sees its connection closed within 1 s of the client leaving.
func TestClientDisconnectMidStream(t *testing.T) {
	up := newFakeUpstream(t, sseEvents(1000, 20*time.Millisecond))
	gw := startGateway(t, gatewayConfig("round_robin", "", up.URL))
	body := chatBody("m", "hi", true)
	c, br := rawRequest(t, gw.addr, fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data: ") || strings.Contains(line, "data: {") {
			break
		}
	}
	closed := time.Now()
	c.Close()
	select {
	case at := <-up.gone:
		if d := at.Sub(closed); d > time.Second {
			t.Fatalf("upstream saw the close after %s", d)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("upstream never saw the client disconnect")
	}
	waitFor(t, 2*time.Second, "in-flight to return to 0", func() bool { return gw.g.Snapshot().Providers[0].Inflight() == 0 })
}

// TestClientDisconnectNonStream: a non-streaming request whose client leaves while the upstream is still
// generating closes the upstream connection too.
func TestClientDisconnectNonStream(t *testing.T) {
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
	gw := startGateway(t, gatewayConfig("round_robin", "", up.URL))
	body := chatBody("m", "hi", false)
	c, _ := rawRequest(t, gw.addr, fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	waitFor(t, 2*time.Second, "the upstream to get the request", func() bool { return up.requests.Load() == 1 })
	time.Sleep(100 * time.Millisecond)
	closed := time.Now()
	c.Close()
	select {
	case at := <-up.gone:
		if d := at.Sub(closed); d > time.Second {
			t.Fatalf("upstream saw the close after %s", d)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("upstream never saw the client disconnect")
	}
	waitFor(t, 2*time.Second, "in-flight to return to 0", func() bool { return gw.g.Snapshot().Providers[0].Inflight() == 0 })
	// The gateway keeps serving.
	up.setHandler(okJSON)
	if resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false)); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
}

func TestRetryBeforeFirstByte(t *testing.T) {
	bad := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(500)
		fmt.Fprint(w, `{"error":{"message":"engine died","type":"InternalServerError","param":null,"code":500}}`)
	})
	good := newFakeUpstream(t, okJSON)
	// A port nobody listens on: connection refused.
	dead := "http://" + deadAddr(t)

	gw := startGateway(t, gatewayConfig("round_robin", "[retry]\nbackoff_ms = 1\n", bad.URL, dead, good.URL))
	for i := 0; i < 6; i++ {
		resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "hi", false))
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, got)
		}
		if resp.Header.Get("X-Rolter-Target") != "p2" {
			t.Fatalf("request %d answered by %s", i, resp.Header.Get("X-Rolter-Target"))
		}
	}
	// All candidates failing: a 502 that says what happened, in OpenAI's shape.
	gw2 := startGateway(t, gatewayConfig("round_robin", "[retry]\nbackoff_ms = 1\nmax_retries = 1\n", bad.URL, dead))
	resp, got := post(t, gw2.URL+"/v1/chat/completions", chatBody("m", "hi", false))
	if resp.StatusCode != 502 || resp.Header.Get("X-Rolter-Retries") != "1" {
		t.Fatalf("status %d retries %q: %s", resp.StatusCode, resp.Header.Get("X-Rolter-Retries"), got)
	}
	assertOpenAIError(t, got, "upstream_error")
}

// TestNoRetryAfterFirstByte: a stream that dies after its first event is not retried elsewhere; the client
// gets an SSE error event and no [DONE].
func TestNoRetryAfterFirstByte(t *testing.T) {
	dying := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"n\":1}\n\n")
		w.(http.Flusher).Flush()
		time.Sleep(20 * time.Millisecond)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close() // mid-chunk: the engine crashed
		}
	})
	other := newFakeUpstream(t, sseEvents(2, time.Millisecond))
	gw := startGateway(t, gatewayConfig("round_robin", "[retry]\nbackoff_ms = 1\n", dying.URL, other.URL))
	resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "hi", true))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if !strings.HasPrefix(got, "data: {\"n\":1}\n\n") || strings.Contains(got, "[DONE]") || !strings.Contains(got, `data: {"error":{`) {
		t.Fatalf("unexpected stream %q", got)
	}
	if other.requests.Load() != 0 {
		t.Fatalf("a started stream was retried on another target")
	}
	// The error event is valid JSON in OpenAI's shape.
	ev := strings.TrimPrefix(strings.TrimSpace(got[strings.LastIndex(got, "data: "):]), "data: ")
	assertOpenAIError(t, ev, "upstream_stream_error")
}

func TestTimeouts(t *testing.T) {
	// Headers never come: 504 after timeouts.headers_secs, and the request is not retried elsewhere.
	hang := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
	other := newFakeUpstream(t, okJSON)
	gw := startGateway(t, gatewayConfig("round_robin", "[timeouts]\nheaders_secs = 0.3\nidle_secs = 0.3\n", hang.URL, other.URL))
	start := time.Now()
	resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "hi", false))
	if resp.StatusCode != 504 {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %s", d)
	}
	assertOpenAIError(t, got, "upstream_timeout")

	// A stream that stalls longer than idle_secs ends with an error event.
	gw = startGateway(t, gatewayConfig("round_robin", "[timeouts]\nheaders_secs = 0.3\nidle_secs = 0.3\n", hang.URL))
	hang.setHandler(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"n\":1}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
	_, got = post(t, gw.URL+"/v1/chat/completions", chatBody("m", "hi", true))
	if !strings.Contains(got, `"code":"upstream_timeout"`) || strings.Contains(got, "[DONE]") {
		t.Fatalf("stalled stream: %q", got)
	}

	// A healthy stream longer than both timeouts, with gaps shorter than idle_secs, is not cut.
	hang.setHandler(sseEvents(12, 100*time.Millisecond))
	_, got = post(t, gw.URL+"/v1/chat/completions", chatBody("m", "hi", true))
	if strings.Count(got, "chat.completion.chunk") != 12 || !strings.HasSuffix(got, "data: [DONE]\n\n") {
		t.Fatalf("healthy long stream was cut: %q", got)
	}
}

func TestUpstreamErrorNormalised(t *testing.T) {
	up := newFakeUpstream(t, nil)
	gw := startGateway(t, gatewayConfig("round_robin", "", up.URL))
	f := func(status int, body, wantCode, wantMsg string) {
		t.Helper()
		up.setHandler(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			io.WriteString(w, body)
		})
		resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "hi", false))
		if resp.StatusCode != status {
			t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, got)
		}
		e := assertOpenAIError(t, got, wantCode)
		if e.Message != wantMsg {
			t.Fatalf("message %q, want %q", e.Message, wantMsg)
		}
	}
	f(400, `{"error":{"message":"max_tokens too large","type":"BadRequestError","param":"max_tokens","code":400}}`, "bad_request", "max_tokens too large")
	f(400, `{"object":"error","message":"old vllm","type":"BadRequestError","param":null,"code":400}`, "bad_request", "old vllm")
	// A body that is not an error object is not relayed (it may be a proxy's page with internal details).
	f(404, `Not Found at 10.0.0.7:8000`, "not_found", "the upstream answered HTTP 404")
	f(422, `{"detail":"bad field"}`, "unprocessable_entity", "bad field")
	f(401, `{"error":{"message":"no key","type":"invalid_request_error","code":"invalid_api_key"}}`, "invalid_api_key", "no key")
}

type openAIError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

func assertOpenAIError(t *testing.T, body, wantCode string) openAIError {
	t.Helper()
	var e struct {
		Error *openAIError `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == nil {
		t.Fatalf("not an OpenAI error body (%v): %s", err, body)
	}
	if e.Error.Code != wantCode || e.Error.Type == "" || e.Error.Message == "" {
		t.Fatalf("error %+v, want code %q", *e.Error, wantCode)
	}
	return *e.Error
}

func TestBadInput(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGateway(t, gatewayConfig("round_robin", "", up.URL))
	url := gw.URL + "/v1/chat/completions"
	f := func(method, ct, body string, wantStatus int, wantCode string) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != wantStatus {
			t.Fatalf("%s %q: status %d, want %d: %s", method, body, resp.StatusCode, wantStatus, b)
		}
		assertOpenAIError(t, string(b), wantCode)
		if resp.Header.Get("X-Request-Id") == "" {
			t.Fatalf("no x-request-id on an error")
		}
	}
	f("POST", "application/json", `{"model":`, 400, "invalid_json")
	f("POST", "application/json", `[1,2]`, 400, "invalid_body")
	f("POST", "application/json", `"text"`, 400, "invalid_body")
	f("POST", "application/json", `{"messages":[]}`, 400, "missing_model")
	f("POST", "application/json", `{"model":42}`, 400, "invalid_model")
	f("POST", "application/json", `{"model":"m","model":"other"}`, 400, "duplicate_model")
	f("POST", "application/json", `{"model":"gpt-9"}`, 404, "model_not_found")
	f("GET", "", "", 405, "method_not_allowed")
	f("POST", "text/plain", `{"model":"m"}`, 415, "unsupported_media_type")
	f("POST", "application/x-www-form-urlencoded", `{"model":"m"}`, 415, "unsupported_media_type")
	if up.requests.Load() != 0 {
		t.Fatalf("bad requests reached the upstream")
	}
	// Still serving, and a JSON with a charset is fine.
	f2, got := post(t, url, chatBody("m", "ok", false), "Content-Type", "application/json; charset=utf-8")
	if f2.StatusCode != 200 {
		t.Fatalf("status %d: %s", f2.StatusCode, got)
	}
}

func TestOversizedInput(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	cfg := gatewayConfig("round_robin", "", up.URL)
	cfg = strings.Replace(cfg, "[server]\n", "[server]\nmax_body_bytes = 1024\nmax_header_bytes = 4096\n", 1)
	gw := startGateway(t, cfg)

	big := chatBody("m", strings.Repeat("a", 2000), false)
	resp, got := post(t, gw.URL+"/v1/chat/completions", big)
	if resp.StatusCode != 413 {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	assertOpenAIError(t, got, "request_too_large")

	// The gateway answers as soon as the headers overflow, while the client may still be writing them: the
	// lingering close (TestLingeringClose) lets it finish and read the answer.
	req, _ := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(chatBody("m", "a", false)))
	req.Header.Set("X-Huge", strings.Repeat("h", 8000))
	r2, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r2.Body)
	r2.Body.Close()
	if r2.StatusCode != 431 {
		t.Fatalf("status %d: %s", r2.StatusCode, b)
	}
	assertOpenAIError(t, string(b), "header_too_large")

	if resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "small", false)); resp.StatusCode != 200 {
		t.Fatalf("status %d after bad input: %s", resp.StatusCode, got)
	}
}

func TestInfoEndpoints(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGateway(t, gatewayConfig("least_load", "", up.URL))
	get := func(path string) (int, string) {
		resp, err := testClient.Get(gw.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	code, body := get("/v1/models")
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID, Object string
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &models); err != nil || code != 200 || models.Object != "list" || len(models.Data) != 1 || models.Data[0].ID != "m" || models.Data[0].Object != "model" {
		t.Fatalf("/v1/models: %d %s", code, body)
	}
	if code, body := get("/v1/models/m"); code != 200 || !strings.Contains(body, `"id":"m"`) {
		t.Fatalf("/v1/models/m: %d %s", code, body)
	}
	if code, body := get("/v1/models/zz"); code != 404 || !strings.Contains(body, "model_not_found") {
		t.Fatalf("/v1/models/zz: %d %s", code, body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz: %d", code)
	}
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz: %d", code)
	}
	if code, body := get("/nope"); code != 404 || !strings.Contains(body, `"code":"not_found"`) {
		t.Fatalf("/nope: %d %s", code, body)
	}
	post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
	_, metrics := get("/metrics")
	for _, want := range []string{
		`rolter_requests_total{route="m",target="p0",code="200"} 1`,
		`rolter_decisions_total{route="m",strategy="least_load",decision="least_load"} 1`,
		`rolter_inflight_requests{target="p0"} 0`,
		`rolter_request_duration_seconds_bucket{route="m",target="p0",le=`,
	} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("/metrics lacks %q", want)
		}
	}
}

// TestReadyzEmptyGateway: a gateway without routes is ready (it can take its first routes through the
// control plane or a reload); once it has routes, readiness is about them.
func TestReadyzEmptyGateway(t *testing.T) {
	gw := startGateway(t, "[server]\nlisten = \"127.0.0.1:0\"\n")
	readyz := func() (int, string) {
		t.Helper()
		resp, err := testClient.Get(gw.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	if code, body := readyz(); code != 200 || body != "ready: no routes yet\n" {
		t.Fatalf("/readyz of an empty gateway: %d %q, want 200", code, body)
	}
	// Its first route, whose only target cannot be reached: still ready until health says otherwise,
	// and no longer "no routes".
	cfg, err := config.Parse([]byte(gatewayConfig("round_robin", "", "http://127.0.0.1:1")), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.g.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if code, body := readyz(); code != 200 || body != "ready\n" {
		t.Fatalf("/readyz with a route: %d %q, want 200 ready", code, body)
	}
}

// TestDrain: Shutdown lets an in-flight stream finish and refuses new connections.
func TestDrain(t *testing.T) {
	up := newFakeUpstream(t, sseEvents(10, 50*time.Millisecond))
	gw := startGateway(t, gatewayConfig("round_robin", "", up.URL))
	result := make(chan string, 1)
	go func() {
		resp, err := testClient.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", "hi", true)))
		if err != nil {
			result <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		result <- string(b)
	}()
	waitFor(t, 2*time.Second, "the stream to start", func() bool { return up.requests.Load() == 1 })
	done := make(chan error, 1)
	go func() {
		ctx, cancel := contextWithTimeout(5 * time.Second)
		defer cancel()
		done <- gw.g.Shutdown(ctx)
	}()
	got := <-result
	if !strings.HasSuffix(got, "data: [DONE]\n\n") {
		t.Fatalf("in-flight stream cut by the drain: %q", got)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := net.DialTimeout("tcp", gw.addr, time.Second); err == nil {
		t.Fatalf("still accepting connections after shutdown")
	}
}

// TestShutdownRightAfterServe: Shutdown called before the Serve goroutine got going still stops it.
func TestShutdownRightAfterServe(t *testing.T) {
	for i := 0; i < 50; i++ {
		cfg, _ := config.Parse([]byte(gatewayConfig("round_robin", "", "http://127.0.0.1:1")), "t.toml")
		g, err := New(cfg, Options{Logger: quietLog()})
		if err != nil {
			t.Fatal(err)
		}
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		done := make(chan error, 1)
		go func() { done <- g.Serve(ln) }()
		ctx, cancel := contextWithTimeout(5 * time.Second)
		g.Shutdown(ctx)
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Serve kept running after Shutdown")
		}
	}
}

// TestUpstreamConnectionClose: an upstream that answers "Connection: close" does not get that connection
// reused (the next request would otherwise meet a closed socket).
func TestUpstreamConnectionClose(t *testing.T) {
	var conns sync.Map
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		conns.Store(r.RemoteAddr, true)
		w.Header().Set("Connection", "close")
		okJSON(w, r)
	})
	gw := startGateway(t, gatewayConfig("round_robin", "", up.URL))
	for i := 0; i < 5; i++ {
		if resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false)); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, got)
		}
	}
	n := 0
	conns.Range(func(any, any) bool { n++; return true })
	if n != 5 {
		t.Fatalf("5 requests used %d upstream connections", n)
	}
	if st := gw.g.Snapshot().Providers[0]; st.up.open.Load() != 0 {
		t.Fatalf("%d connections left open", st.up.open.Load())
	}
	if _, m := getMetrics(t, gw); strings.Contains(m, `kind="stale"`) {
		t.Fatalf("a closed connection was pooled and reused (stale resend counted)")
	}
}

func getMetrics(t *testing.T, gw *testGateway) (int, string) {
	t.Helper()
	resp, err := testClient.Get(gw.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestProxyEarlyAnswerToLargeBody: an upstream that answers before it has read a large request body (a
// proxy's 413 after the headers) has its answer arrive while the gateway is still writing the body. The
// gateway must still see it at once - not wait for a readiness that already passed until the headers
// timeout and answer 504.
func TestProxyEarlyAnswerToLargeBody(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				br := bufio.NewReader(c)
				for { // headers
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					if line == "\r\n" {
						break
					}
				}
				_, _ = c.Write([]byte("HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"))
				_, _ = io.Copy(io.Discard, br) // drain the body; keep the connection open
			}(c)
		}
	}()
	gw := startGateway(t, gatewayConfig("round_robin", "[timeouts]\nheaders_secs = 5\n", "http://"+ln.Addr().String()))
	body := chatBody("m", strings.Repeat("x", 4<<20), false)
	start := time.Now()
	resp, _ := post(t, gw.URL+"/v1/chat/completions", body)
	if took := time.Since(start); resp.StatusCode != http.StatusRequestEntityTooLarge || took > 4*time.Second {
		t.Fatalf("status %d after %v, want 413 at once", resp.StatusCode, took)
	}
}
