package engine

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// accessLines reads the JSON lines of an access log.
func accessLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("bad access log line %q: %s", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

// lineFor returns the access-log line of a request id.
func lineFor(lines []map[string]any, id string) map[string]any {
	for _, l := range lines {
		if l["request_id"] == id {
			return l
		}
	}
	return nil
}

// TestAccessLog: one line per request with the documented fields, for JSON and SSE answers, a retried
// request, an upstream failure and a client that left; no prompt text and no Authorization value.
func TestAccessLog(t *testing.T) {
	const usage = `"usage":{"prompt_tokens":40,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":32}}`
	var failFirst atomic.Bool
	good := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("X-Request-Id"), "allfail") {
			w.WriteHeader(503)
			return
		}
		if strings.Contains(r.Header.Get("X-Request-Id"), "slowstream") {
			w.Header().Set("Content-Type", "text/event-stream")
			// An event every 20 ms until the gateway hangs up (its writes fail once the client left).
			for r.Context().Err() == nil {
				if _, err := io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				time.Sleep(20 * time.Millisecond)
			}
			return
		}
		if strings.Contains(r.Header.Get("X-Request-Id"), "sse") {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\ndata: {\"choices\":[],"+usage+"}\n\ndata: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","choices":[{"message":{"content":"ok"}}],`+usage+`}`)
	})
	bad := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if failFirst.Load() || strings.Contains(r.Header.Get("X-Request-Id"), "allfail") {
			w.WriteHeader(503)
			return
		}
		good.serve(w, r)
	})
	path := filepath.Join(t.TempDir(), "access.log")
	extra := fmt.Sprintf("[log]\naccess = %q\n[retry]\nbackoff_ms = 0\n[cooldown]\nenabled = false\n[breaker]\nenabled = false\n", path)
	// round_robin over [bad, good]: the first request goes to bad.
	gw := startGateway(t, gatewayConfig("round_robin", extra, bad.URL, good.URL))
	const secret = "Xylophone-prompt-secret"
	ask := func(id string, stream bool) int {
		resp, _ := post(t, gw.URL+"/v1/chat/completions", chatBody("m", secret, stream), "X-Request-Id", id, "Authorization", "Bearer sk-very-secret-key")
		return resp.StatusCode
	}
	failFirst.Store(true)
	if s := ask("req-retried", false); s != 200 {
		t.Fatalf("retried request: %d", s)
	}
	failFirst.Store(false)
	ask("req-json", false)
	ask("req-sse", true)
	// Both targets fail: 502 after retries.
	if s := ask("req-allfail", false); s != 502 {
		t.Fatalf("every target failing answered %d", s)
	}
	// A client that leaves mid-stream.
	conn, err := net.Dial("tcp", gw.addr)
	if err != nil {
		t.Fatal(err)
	}
	body := chatBody("m", secret, true)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Request-Id: req-slowstream\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	br := bufio.NewReader(conn)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	conn.Close()

	var lines []map[string]any
	waitFor(t, 10*time.Second, "access log lines for every request", func() bool {
		lines = accessLines(t, path)
		return lineFor(lines, "req-slowstream") != nil && len(lines) >= 5
	})
	raw, _ := os.ReadFile(path)
	for _, s := range []string{secret, "sk-very-secret-key", "Bearer"} {
		if bytes.Contains(raw, []byte(s)) {
			t.Fatalf("the access log holds %q", s)
		}
	}
	for _, key := range []string{"time", "request_id", "client", "path", "route", "model", "target", "strategy", "decision", "score",
		"status", "retries", "upstream_headers_ms", "first_byte_ms", "duration_ms", "bytes_out", "prompt_tokens", "cached_tokens", "error"} {
		if _, ok := lines[0][key]; !ok {
			t.Fatalf("no %q in %v", key, lines[0])
		}
	}
	r := lineFor(lines, "req-retried")
	if r["status"] != 200.0 || r["retries"] != 1.0 || r["target"] != "p1" || r["prompt_tokens"] != 40.0 || r["cached_tokens"] != 32.0 ||
		r["route"] != "m" || r["strategy"] != "round_robin" || !strings.HasPrefix(r["client"].(string), "127.0.0.1:") {
		t.Fatalf("retried request: %v", r)
	}
	if r["upstream_headers_ms"] == nil || r["first_byte_ms"] == nil || r["duration_ms"].(float64) < r["first_byte_ms"].(float64) {
		t.Fatalf("retried request timings: %v", r)
	}
	if s := lineFor(lines, "req-sse"); s["stream"] != true || s["cached_tokens"] != 32.0 || s["bytes_out"].(float64) <= 0 {
		t.Fatalf("sse request: %v", s)
	}
	if f := lineFor(lines, "req-allfail"); f["status"] != 502.0 || f["error"] != "status" || f["retries"] != 1.0 {
		t.Fatalf("failed request: %v", f)
	}
	if g := lineFor(lines, "req-slowstream"); g["status"] != 499.0 || g["error"] != "client_gone" {
		t.Fatalf("departed client: %v", g)
	}
}

// TestAccessLogRefusals: a request the gateway refuses before routing ends like every other one: its answer
// carries the X-Request-Id the client sent, and it has its access-log line with the status it was answered
// - over [queue] max_inflight (429), refused by checkRequest (a header name that is not a token: 400; an
// expectation other than 100-continue, answered before the body: 417), an unknown path (404), and one the
// HTTP parser refused (431).
func TestAccessLogRefusals(t *testing.T) {
	release := make(chan struct{})
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
		okJSON(w, r)
	})
	defer close(release)
	path := filepath.Join(t.TempDir(), "access.log")
	gw := startGateway(t, gatewayConfig("round_robin", fmt.Sprintf("[log]\naccess = %q\n[queue]\nmax_inflight = 1\n", path), up.URL))
	go fire(gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
	waitFor(t, 2*time.Second, "1 in flight", func() bool { return gw.g.inflight.Load() == 1 })

	body := chatBody("m", "x", false)
	f := func(id string, raw string, method string, status int) {
		t.Helper()
		c, br := rawRequest(t, gw.addr, raw)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, got := readResponse(t, br, method)
		// The head too large to parse has a fresh id: its X-Request-Id was never read.
		if rid := resp.Header.Get("X-Request-Id"); resp.StatusCode != status || rid != id && (id != "" || len(rid) != 16) {
			t.Fatalf("%s: status %d, X-Request-Id %q: %s", id, resp.StatusCode, rid, got)
		}
	}
	f("req-capped", rawPost("/v1/chat/completions", body, "X-Request-Id: req-capped\r\n"), "POST", 429)
	f("req-bad-header", rawPost("/v1/chat/completions", body, "X-Request-Id: req-bad-header\r\nX Spaced: 1\r\n"), "POST", 400)
	f("req-teapot", rawPost("/v1/chat/completions", body, "X-Request-Id: req-teapot\r\nExpect: teapot\r\n"), "POST", 417)
	f("req-unknown", "GET /nowhere HTTP/1.1\r\nHost: x\r\nX-Request-Id: req-unknown\r\n\r\n", "GET", 404)
	f("", "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Request-Id: req-huge-head\r\nX-Big: "+strings.Repeat("a", 64<<10)+"\r\n\r\n", "GET", 431)

	want := map[string]float64{"req-capped": 429, "req-bad-header": 400, "req-teapot": 417, "req-unknown": 404}
	var lines []map[string]any
	waitFor(t, 5*time.Second, "a line for every refusal", func() bool {
		lines = accessLines(t, path)
		for id := range want {
			if lineFor(lines, id) == nil {
				return false
			}
		}
		return len(lines) >= len(want)+1
	})
	for id, status := range want {
		l := lineFor(lines, id)
		if l["status"] != status || l["error"] != "client_error" || l["route"] != nil {
			t.Fatalf("%s: %v", id, l)
		}
	}
	if l := lineFor(lines, "req-capped"); l["path"] != "/v1/chat/completions" {
		t.Fatalf("refused at the cap: %v", l)
	}
	if l := lineFor(lines, "req-unknown"); l["path"] != nil {
		t.Fatalf("an unknown path is logged as %v, not as an engine constant", l["path"])
	}
	n := 0
	for _, l := range lines {
		if l["status"] == 431.0 {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d lines with status 431, want 1: %v", n, lines)
	}
}

// TestAccessLogModes: sampling logs about the configured fraction; slow-only mode logs only slow requests.
func TestAccessLogModes(t *testing.T) {
	var slow atomic.Bool
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if slow.Load() {
			time.Sleep(60 * time.Millisecond)
		}
		okJSON(w, r)
	})
	dir := t.TempDir()
	sampled := filepath.Join(dir, "sampled.log")
	gw := startGateway(t, gatewayConfig("round_robin", fmt.Sprintf("[log]\naccess = %q\nsample = 0.2\nformat = \"text\"\n", sampled), up.URL))
	for range 400 {
		post(t, gw.URL+"/v1/chat/completions", chatBody("m", "hi", false))
	}
	var n int
	waitFor(t, 5*time.Second, "sampled lines", func() bool {
		raw, _ := os.ReadFile(sampled)
		n = bytes.Count(raw, []byte("\n"))
		return n > 40
	})
	if n < 40 || n > 140 {
		t.Fatalf("sample 0.2 of 400 requests logged %d lines", n)
	}

	slowPath := filepath.Join(dir, "slow.log")
	gw2 := startGateway(t, gatewayConfig("round_robin", fmt.Sprintf("[log]\naccess = %q\nsample = 0\nslow_ms = 40\n", slowPath), up.URL))
	for i := range 10 {
		slow.Store(i%5 == 0)
		post(t, gw2.URL+"/v1/chat/completions", chatBody("m", "hi", false), "X-Request-Id", fmt.Sprint("r", i))
	}
	var lines []map[string]any
	waitFor(t, 5*time.Second, "2 slow lines", func() bool {
		lines = accessLines(t, slowPath)
		return len(lines) >= 2
	})
	time.Sleep(200 * time.Millisecond)
	lines = accessLines(t, slowPath)
	if len(lines) != 2 || lineFor(lines, "r0") == nil || lineFor(lines, "r5") == nil {
		t.Fatalf("slow-only log: %v", lines)
	}
}

// TestAccessLogFullQueue: a destination that does not take writes fills the queue; lines are dropped and
// counted, and no request waits for the log.
func TestAccessLogFullQueue(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skip("no named pipes:", err)
	}
	// A reader that never reads: the pipe's buffer fills and the writer blocks.
	rd, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	up := newFakeUpstream(t, okJSON)
	gw := startGateway(t, gatewayConfig("round_robin", fmt.Sprintf("[log]\naccess = %q\nqueue_size = 8\n", fifo), up.URL))
	body := chatBody("m", strings.Repeat("x", 100), false)
	start := time.Now()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 300 {
				if resp, got := post(t, gw.URL+"/v1/chat/completions", body, "X-Request-Id", strings.Repeat("id", 60)); resp.StatusCode != 200 {
					t.Errorf("status %d: %s", resp.StatusCode, got)
					return
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	_, text := getMetrics(t, gw)
	dropped := metricValue(text, `rolter_access_log_lines_total{result="dropped"}`)
	if dropped <= 0 {
		t.Fatalf("1200 lines into a blocked pipe, none dropped (%v)", metricValue(text, `rolter_access_log_lines_total{result="written"}`))
	}
	t.Logf("1200 requests in %v with the log blocked; %v lines dropped", took, dropped)
	rd.Close() // lets the writer's blocked write fail, so Shutdown can close the log
}

// otlpReceiver is an OTLP/HTTP trace receiver on loopback.
type otlpReceiver struct {
	mu    sync.Mutex
	reqs  []*collectortrace.ExportTraceServiceRequest
	url   string
	count atomic.Int64
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	rc := &otlpReceiver{}
	srv := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Header.Get("Content-Encoding") == "gzip" {
			b = gunzip(t, b)
		}
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			t.Errorf("bad OTLP body: %s", err)
			w.WriteHeader(400)
			return
		}
		rc.mu.Lock()
		rc.reqs = append(rc.reqs, &req)
		rc.mu.Unlock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				rc.count.Add(int64(len(ss.Spans)))
			}
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(200)
	})
	rc.url = srv.URL
	return rc
}

// TestTraceContextAndSpans: the upstream receives traceparent with the client's trace id and the
// gateway's span as parent; the span reaches an OTLP receiver with the routing attributes.
func TestTraceContextAndSpans(t *testing.T) {
	rc := newOTLPReceiver(t)
	var seen atomic.Value
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get("Traceparent") + "|" + r.Header.Get("Tracestate"))
		okJSON(w, r)
	})
	extra := fmt.Sprintf("[tracing]\nendpoint = %q\nsample_ratio = 1\n[egress]\nblock_loopback = false\n", rc.url)
	gw := startGateway(t, gatewayConfig("cache_aware", extra, up.URL))
	const tid, sid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "hello", false),
		"Traceparent", "00-"+tid+"-"+sid+"-01", "Tracestate", "vendor=opaque")
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, got)
	}
	parts := strings.Split(seen.Load().(string), "|")
	f := strings.Split(parts[0], "-")
	if len(f) != 4 || f[1] != tid || f[2] == sid || f[3] != "01" || parts[1] != "vendor=opaque" {
		t.Fatalf("upstream got traceparent %q tracestate %q", parts[0], parts[1])
	}
	gwSpan := f[2]
	waitFor(t, 15*time.Second, "the span at the receiver", func() bool { return rc.count.Load() >= 1 })
	rc.mu.Lock()
	defer rc.mu.Unlock()
	sp := rc.reqs[0].ResourceSpans[0].ScopeSpans[0].Spans[0]
	if hex.EncodeToString(sp.TraceId) != tid || hex.EncodeToString(sp.ParentSpanId) != sid || hex.EncodeToString(sp.SpanId) != gwSpan {
		t.Fatalf("span ids: trace %x parent %x span %x", sp.TraceId, sp.ParentSpanId, sp.SpanId)
	}
	attrs := map[string]string{}
	for _, kv := range sp.Attributes {
		attrs[kv.Key] = fmt.Sprint(kv.Value.GetStringValue(), kv.Value.GetIntValue(), kv.Value.GetDoubleValue())
	}
	for _, k := range []string{"rolter.route", "rolter.target", "rolter.strategy", "rolter.decision", "rolter.retries", "http.response.status_code"} {
		if _, ok := attrs[k]; !ok {
			t.Fatalf("span has no %s: %v", k, attrs)
		}
	}
	if !strings.HasPrefix(attrs["rolter.target"], "p0") || !strings.HasPrefix(attrs["rolter.strategy"], "cache_aware") {
		t.Fatalf("span attributes %v", attrs)
	}
	// Without a traceparent the gateway starts a trace; the upstream still gets one.
	post(t, gw.URL+"/v1/chat/completions", chatBody("m", "hello", false))
	if p := strings.Split(seen.Load().(string), "|")[0]; len(p) != 55 {
		t.Fatalf("no traceparent started: %q", p)
	}
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
