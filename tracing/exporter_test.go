package tracing

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	_ "google.golang.org/grpc/encoding/gzip" // the test receiver accepts gzip-compressed exports
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// received collects what a test receiver was sent.
type received struct {
	mu      sync.Mutex
	reqs    []*coltracepb.ExportTraceServiceRequest
	headers []map[string]string // per request: lower-case header (or metadata) name -> value
}

func (r *received) add(req *coltracepb.ExportTraceServiceRequest, h map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, req)
	r.headers = append(r.headers, h)
}

// spans returns every received span with its resource's service.name.
func (r *received) spans() (spans []*tracepb.Span, services []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, req := range r.reqs {
		for _, rs := range req.ResourceSpans {
			svc := ""
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					svc = kv.Value.GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				if ss.GetScope().GetName() != ScopeName {
					continue
				}
				for _, sp := range ss.Spans {
					spans = append(spans, sp)
					services = append(services, svc)
				}
			}
		}
	}
	return spans, services
}

// httpReceiver is an OTLP/HTTP collector on 127.0.0.1: it decodes ExportTraceServiceRequest protobuf
// (gzip or not) from POST /v1/traces. Each request first waits for gate, when set.
func httpReceiver(t *testing.T, gate chan struct{}) (*received, string) {
	t.Helper()
	rec := &received{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %s", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if gate != nil {
			<-gate
		}
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("receiver got %s %s (%s); want POST /v1/traces protobuf", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			t.Errorf("receiver cannot decode the export: %s", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		h := map[string]string{}
		for k, v := range r.Header {
			h[strings.ToLower(k)] = v[0]
		}
		rec.add(&req, h)
		resp, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(resp)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() {
		if gate != nil {
			select {
			case <-gate:
			default:
				close(gate)
			}
		}
		_ = srv.Close()
	})
	return rec, ln.Addr().String()
}

// grpcReceiver is an OTLP/gRPC collector on 127.0.0.1.
type grpcReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	rec *received
}

func (g *grpcReceiver) Export(ctx context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	h := map[string]string{}
	md, _ := metadata.FromIncomingContext(ctx)
	for k, v := range md {
		h[k] = v[0]
	}
	g.rec.add(req, h)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func startGRPCReceiver(t *testing.T) (*received, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %s", err)
	}
	rec := &received{}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, &grpcReceiver{rec: rec})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return rec, ln.Addr().String()
}

// countingDial is a DialFunc that counts its calls and remembers the addresses it was asked for.
type countingDial struct {
	calls atomic.Int64
	mu    sync.Mutex
	addrs []string
}

func (d *countingDial) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.calls.Add(1)
	d.mu.Lock()
	d.addrs = append(d.addrs, network+" "+addr)
	d.mu.Unlock()
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

var t0 = time.Date(2026, 11, 25, 10, 0, 0, 123_000_000, time.UTC)

// testSpans are a child of a caller's span with two retries, and a root span that failed.
func testSpans() (child, root *Span) {
	child = &Span{}
	child.Reset()
	child.Context = mustTC(specTraceID, "1111111111111111", FlagSampled)
	copy(child.Parent[:], []byte{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7})
	child.Method, child.Path = "POST", "/v1/chat/completions"
	child.Start, child.End = t0, t0.Add(1873*time.Millisecond)
	child.Status = 200
	child.Route, child.Model, child.Target = "llama", "llama", "vllm-2"
	child.Strategy, child.Decision, child.Score = "cache_aware", "prefix_hit", 0.8125
	child.Retries = 2
	child.SetRequestID([]byte("req-7f3a"))
	child.PromptTokens, child.CachedTokens = 2048, 1664
	child.FirstByte = t0.Add(41 * time.Millisecond)
	child.AddRetry(t0.Add(5*time.Millisecond), "vllm-1", "upstream_5xx")
	child.AddRetry(t0.Add(12*time.Millisecond), "vllm-3", "connect")

	root = &Span{}
	root.Reset()
	root.Context = NewTraceContext(TraceContext{}, false, NewSampler(1))
	root.Name = "POST /v1/completions (custom)"
	root.Method, root.Path = "POST", "/v1/completions"
	root.Start, root.End = t0.Add(time.Second), t0.Add(1500*time.Millisecond)
	root.Status = 502
	root.Route, root.Model, root.Strategy, root.Decision = "qwen", "qwen", "least_load", "least_load"
	root.Error = "upstream_5xx"
	return child, root
}

func attrMap(kvs []*commonpb.KeyValue) map[string]any {
	m := map[string]any{}
	for _, kv := range kvs {
		switch v := kv.Value.Value.(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.Key] = v.IntValue
		case *commonpb.AnyValue_DoubleValue:
			m[kv.Key] = v.DoubleValue
		case *commonpb.AnyValue_BoolValue:
			m[kv.Key] = v.BoolValue
		default:
			m[kv.Key] = kv.Value.String()
		}
	}
	return m
}

// checkSpans compares what the receiver got with testSpans.
func checkSpans(t *testing.T, rec *received, child, root *Span) {
	t.Helper()
	spans, services := rec.spans()
	if len(spans) != 2 {
		t.Fatalf("receiver got %d spans; want 2", len(spans))
	}
	byName := map[string]*tracepb.Span{}
	for i, sp := range spans {
		byName[sp.Name] = sp
		if services[i] != "rolter-test" {
			t.Fatalf("span %q: service.name %q; want rolter-test", sp.Name, services[i])
		}
	}
	c, r := byName["POST /v1/chat/completions"], byName["POST /v1/completions (custom)"]
	if c == nil || r == nil {
		t.Fatalf("span names %v", byName)
	}
	eq := func(what string, got, want any) {
		t.Helper()
		if got != want {
			t.Fatalf("%s = %v; want %v", what, got, want)
		}
	}
	// Ids: the ones decided when the request arrived.
	eq("child trace id", hex.EncodeToString(c.TraceId), specTraceID)
	eq("child span id", hex.EncodeToString(c.SpanId), "1111111111111111")
	eq("child parent span id", hex.EncodeToString(c.ParentSpanId), specSpanID)
	eq("root trace id", hex.EncodeToString(r.TraceId), hex.EncodeToString(root.Context.TraceID[:]))
	eq("root span id", hex.EncodeToString(r.SpanId), hex.EncodeToString(root.Context.SpanID[:]))
	eq("root parent span id", len(r.ParentSpanId), 0)
	// Timestamps: the request's own.
	eq("child start", c.StartTimeUnixNano, uint64(child.Start.UnixNano()))
	eq("child end", c.EndTimeUnixNano, uint64(child.End.UnixNano()))
	eq("root start", r.StartTimeUnixNano, uint64(root.Start.UnixNano()))
	eq("root end", r.EndTimeUnixNano, uint64(root.End.UnixNano()))
	eq("kind", c.Kind, tracepb.Span_SPAN_KIND_SERVER)
	// Attributes.
	ca := attrMap(c.Attributes)
	want := map[string]any{
		"http.request.method": "POST", "url.path": "/v1/chat/completions", "http.response.status_code": int64(200),
		"rolter.route": "llama", "rolter.model": "llama", "rolter.target": "vllm-2", "rolter.strategy": "cache_aware",
		"rolter.decision": "prefix_hit", "rolter.score": 0.8125, "rolter.retries": int64(2),
		"rolter.request_id": "req-7f3a", "rolter.prompt_tokens": int64(2048), "rolter.cached_tokens": int64(1664),
	}
	if len(ca) != len(want) {
		t.Fatalf("child attributes %v; want %v", ca, want)
	}
	for k, v := range want {
		eq("child "+k, ca[k], v)
	}
	ra := attrMap(r.Attributes)
	eq("root error.type", ra["error.type"], "upstream_5xx")
	eq("root status code", ra["http.response.status_code"], int64(502))
	for _, k := range []string{"rolter.score", "rolter.target", "rolter.request_id", "rolter.prompt_tokens"} {
		if _, ok := ra[k]; ok {
			t.Fatalf("root has %s = %v; unknown values must be left out", k, ra[k])
		}
	}
	// Status.
	eq("child status", c.GetStatus().GetCode(), tracepb.Status_STATUS_CODE_UNSET)
	eq("root status", r.GetStatus().GetCode(), tracepb.Status_STATUS_CODE_ERROR)
	eq("root status message", r.GetStatus().GetMessage(), "upstream_5xx")
	// Events: first byte, then the retries in order with their attempt's target and error class.
	if len(c.Events) != 3 {
		t.Fatalf("child events %v; want first_byte and 2 retries", c.Events)
	}
	evs := map[string][]*tracepb.Span_Event{}
	for _, ev := range c.Events {
		evs[ev.Name] = append(evs[ev.Name], ev)
	}
	eq("first_byte events", len(evs[EventFirstByte]), 1)
	eq("first_byte time", evs[EventFirstByte][0].TimeUnixNano, uint64(child.FirstByte.UnixNano()))
	eq("retry events", len(evs[EventRetry]), 2)
	for i, ev := range evs[EventRetry] {
		eq("retry time", ev.TimeUnixNano, uint64(child.RetryEvents[i].Time.UnixNano()))
		a := attrMap(ev.Attributes)
		eq("retry number", a["rolter.retry"], int64(i+1))
		eq("retry target", a["rolter.target"], child.RetryEvents[i].Target)
		eq("retry error", a["error.type"], child.RetryEvents[i].Error)
	}
	eq("root events", len(r.Events), 0)
}

func testConfig(endpoint string) Config {
	c := DefaultConfig()
	c.Endpoint = endpoint
	c.ServiceName = "rolter-test"
	c.Headers = map[string]string{"X-Collector-Key": "k1"}
	c.TimeoutSecs = 5
	return c
}

func shutdown(t *testing.T, e *Exporter) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %s", err)
	}
}

func TestExportHTTP(t *testing.T) {
	rec, addr := httpReceiver(t, nil)
	var d countingDial
	e, err := New(testConfig("http://"+addr), d.dial, quietLog)
	if err != nil {
		t.Fatalf("New: %s", err)
	}
	child, root := testSpans()
	e.Record(child)
	e.Record(root)
	unsampled := *child
	unsampled.Context.Flags = 0
	e.Record(&unsampled) // not exported, not counted
	shutdown(t, e)
	checkSpans(t, rec, child, root)
	if e.Exported() != 2 || e.Dropped() != 0 || e.Failed() != 0 {
		t.Fatalf("exported %d, dropped %d, failed %d; want 2, 0, 0", e.Exported(), e.Dropped(), e.Failed())
	}
	if d.calls.Load() == 0 || d.addrs[0] != "tcp "+addr {
		t.Fatalf("the dial func was not used for the collector: %d calls %v", d.calls.Load(), d.addrs)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.headers[0]["x-collector-key"] != "k1" || rec.headers[0]["content-encoding"] != "gzip" {
		t.Fatalf("export headers %v; want x-collector-key and gzip", rec.headers[0])
	}
}

func TestExportGRPC(t *testing.T) {
	rec, addr := startGRPCReceiver(t)
	_, port, _ := net.SplitHostPort(addr)
	var d countingDial
	// "localhost", not the address: the dialer must see the name as written (passthrough resolver).
	e, err := New(testConfig("grpc://localhost:"+port), d.dial, quietLog)
	if err != nil {
		t.Fatalf("New: %s", err)
	}
	if d.calls.Load() != 0 {
		t.Fatalf("New dialled the collector")
	}
	child, root := testSpans()
	e.Record(child)
	e.Record(root)
	shutdown(t, e)
	checkSpans(t, rec, child, root)
	if e.Exported() != 2 || e.Failed() != 0 {
		t.Fatalf("exported %d, failed %d; want 2, 0", e.Exported(), e.Failed())
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.addrs) == 0 || d.addrs[0] != "tcp localhost:"+port {
		t.Fatalf("dial calls %v; want tcp localhost:%s", d.addrs, port)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.headers[0]["x-collector-key"] != "k1" {
		t.Fatalf("export metadata %v; want x-collector-key", rec.headers[0])
	}
}

// TestFullQueueDrops blocks the collector: Record must keep returning at once, drop what does not fit
// and count it; once the collector answers, every span not dropped is exported.
func TestFullQueueDrops(t *testing.T) {
	gate := make(chan struct{})
	rec, addr := httpReceiver(t, gate)
	c := testConfig("http://" + addr)
	c.QueueSize = 4
	e, err := New(c, nil, quietLog)
	if err != nil {
		t.Fatalf("New: %s", err)
	}
	child, _ := testSpans()
	const n = 10_000
	var slowest time.Duration
	start := time.Now()
	for i := 0; i < n; i++ {
		t1 := time.Now()
		e.Record(child)
		slowest = max(slowest, time.Since(t1))
	}
	elapsed := time.Since(start)
	if e.Dropped() == 0 || e.Dropped() >= n {
		t.Fatalf("dropped %d of %d; want some dropped and some kept", e.Dropped(), n)
	}
	// A blocked call would wait for as long as the destination is blocked (until the test unblocks it),
	// so bounds generous enough for a loaded machine still catch one.
	if elapsed > 5*time.Second || slowest > time.Second {
		t.Fatalf("Record blocked: %d calls took %v, the slowest %v", n, elapsed, slowest)
	}
	close(gate)
	shutdown(t, e)
	spans, _ := rec.spans()
	if uint64(len(spans)) != e.Exported() || e.Exported()+e.Dropped() != n || e.Failed() != 0 {
		t.Fatalf("received %d; exported %d + dropped %d (failed %d) != %d", len(spans), e.Exported(), e.Dropped(), e.Failed(), n)
	}
	// After Shutdown, Record drops and counts.
	e.Record(child)
	if e.Exported()+e.Dropped() != n+1 {
		t.Fatalf("Record after Shutdown not counted as dropped")
	}
	if err := e.Shutdown(context.Background()); err != nil {
		t.Fatalf("second Shutdown: %s", err)
	}
}

func TestFailedExportsCounted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %s", err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	c := testConfig("http://" + addr)
	c.TimeoutSecs = 0.5
	var logs bytes.Buffer
	e, err := New(c, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatalf("New: %s", err)
	}
	child, root := testSpans()
	e.Record(child)
	e.Record(root)
	shutdown(t, e)
	if e.Failed() != 2 || e.Exported() != 0 {
		t.Fatalf("failed %d, exported %d; want 2 and 0", e.Failed(), e.Exported())
	}
	if !strings.Contains(logs.String(), "trace export failed") {
		t.Fatalf("failure not logged: %q", logs.String())
	}
}

func TestDisabledExporter(t *testing.T) {
	e, err := New(DefaultConfig(), nil, quietLog)
	if err != nil {
		t.Fatalf("New: %s", err)
	}
	for _, x := range []*Exporter{nil, e} {
		child, _ := testSpans()
		x.Record(child)
		if x.Enabled() || x.Dropped() != 0 || x.Exported() != 0 || x.Failed() != 0 {
			t.Fatalf("a disabled exporter must do nothing")
		}
		if NewTraceContext(TraceContext{}, false, x.Sampler()).Sampled() {
			t.Fatalf("a disabled exporter's sampler must sample nothing")
		}
		if err := x.Shutdown(context.Background()); err != nil {
			t.Fatalf("Shutdown: %s", err)
		}
	}
	c := DefaultConfig()
	c.Endpoint = "ftp://x"
	if _, err := New(c, nil, quietLog); err == nil || !strings.Contains(err.Error(), "tracing.endpoint") {
		t.Fatalf("New with a bad endpoint: %v", err)
	}
}

func TestSpanHelpers(t *testing.T) {
	var s Span
	s.Reset()
	if s.Score != -1 || s.PromptTokens != -1 || s.CachedTokens != -1 {
		t.Fatalf("Reset: %+v", s)
	}
	for i := 0; i < MaxRetryEvents+3; i++ {
		s.AddRetry(t0.Add(time.Duration(i+1)), "t", "e")
	}
	for i, r := range s.RetryEvents {
		if r.Time != t0.Add(time.Duration(i+1)) {
			t.Fatalf("retry %d at %v", i, r.Time)
		}
	}
	long := strings.Repeat("x", MaxRequestID+5)
	s.SetRequestID([]byte(long))
	if string(s.RequestID[:s.RequestIDLen]) != long[:MaxRequestID] {
		t.Fatalf("SetRequestID did not cut to %d bytes", MaxRequestID)
	}
}
