package tracing

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// DialFunc makes the exporter's connections; the engine passes its egress-policy dialer.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// ScopeName is the instrumentation scope of the gateway's spans.
const ScopeName = "github.com/rolter-ai/rolter/tracing"

const (
	// batchTimeout is the longest a span waits in the batch processor before it is exported.
	batchTimeout = time.Second
	// maxExportBatch is the most spans in one export request.
	maxExportBatch = 512
	// errorLogInterval rate-limits the warnings about failed exports.
	errorLogInterval = time.Minute
)

// Exporter turns the Spans the engine records into OpenTelemetry spans and exports them over OTLP.
// Record is called by request goroutines: it is safe for concurrent use, does not allocate, and its one
// synchronisation is a non-blocking channel send. One goroutine, started by New and stopped by
// Shutdown, builds the spans through the OpenTelemetry SDK with the ids and timestamps the request
// decided, and hands them to a batch span processor that exports them. A nil *Exporter, and the
// Exporter of a config without an endpoint, are valid: they record nothing and sample nothing.
//
// Memory is bounded twice: Record's queue (queue_size Spans of 880 bytes) and the batch processor's
// queue (queue_size finished spans). The processor blocks the building goroutine when its queue is full
// rather than dropping silently, so the one place a span is dropped is Record, where it is counted.
type Exporter struct {
	on      bool
	sampler Sampler

	q        chan Span
	stop     chan struct{}
	done     chan struct{}
	closed   atomic.Bool
	abandon  atomic.Bool // Shutdown's context ended: queued spans are not built
	shutOnce sync.Once
	shutErr  error

	dropped  atomic.Uint64
	exported atomic.Uint64
	failed   atomic.Uint64

	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	conn   *grpc.ClientConn // gRPC only: closed by Shutdown (otlptracegrpc leaves a given conn open)
	log    *slog.Logger

	// Owned by the building goroutine.
	attrs []attribute.KeyValue

	warnMu   sync.Mutex
	lastWarn time.Time
}

// New validates cfg (its zero fields take their defaults, SampleRatio only through DefaultConfig) and,
// when it has an endpoint, builds the OTLP exporter and starts the building goroutine. Every connection
// to the collector is made by dial (nil: a plain net.Dialer): the HTTP exporter's transport dials with
// it, the gRPC exporter's connection uses it as its context dialer and hands it the endpoint's host:port
// unresolved, so the dialer sees the name the operator wrote. No proxy from the environment is used.
// A nil logger means slog.Default(); it receives failed exports, at most one warning a minute.
//
// Nothing is dialled before the first export: a collector that is down makes exports fail (counted,
// logged), not New.
func New(cfg Config, dial DialFunc, logger *slog.Logger) (*Exporter, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Enabled() {
		return &Exporter{}, nil
	}
	ep, err := cfg.endpoint()
	if err != nil {
		return nil, err // unreachable: Validate checked it
	}
	timeout := cfg.timeout()
	if dial == nil {
		dial = (&net.Dialer{Timeout: timeout}).DialContext
	}
	var exp sdktrace.SpanExporter
	var conn *grpc.ClientConn
	switch cfg.Protocol {
	case ProtocolHTTP:
		exp, err = newHTTPExporter(cfg, ep, dial, timeout)
	case ProtocolGRPC:
		exp, conn, err = newGRPCExporter(cfg, ep, dial, timeout)
	}
	if err != nil {
		return nil, err
	}
	return newExporter(cfg, exp, conn, logger), nil
}

// newExporter starts an Exporter over exp; cfg is valid, with its defaults set.
func newExporter(cfg Config, exp sdktrace.SpanExporter, conn *grpc.ClientConn, logger *slog.Logger) *Exporter {
	if logger == nil {
		logger = slog.Default()
	}
	e := &Exporter{
		on:      true,
		sampler: NewSampler(cfg.SampleRatio),
		q:       make(chan Span, cfg.QueueSize),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		conn:    conn,
		log:     logger.With("component", "tracing", "endpoint", cfg.Endpoint),
		attrs:   make([]attribute.KeyValue, 0, 16),
	}
	res := resource.NewSchemaless(attribute.String("service.name", cfg.ServiceName))
	bsp := sdktrace.NewBatchSpanProcessor(&countingExporter{SpanExporter: exp, e: e},
		sdktrace.WithMaxQueueSize(cfg.QueueSize),
		sdktrace.WithMaxExportBatchSize(min(maxExportBatch, cfg.QueueSize)),
		sdktrace.WithBatchTimeout(batchTimeout),
		sdktrace.WithExportTimeout(cfg.timeout()),
		sdktrace.WithBlocking(),
	)
	e.tp = sdktrace.NewTracerProvider(
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.AlwaysSample()), // the request decided (Span.Context.Flags)
		sdktrace.WithIDGenerator(presetIDs{}),
		sdktrace.WithSpanProcessor(bsp),
	)
	e.tracer = e.tp.Tracer(ScopeName)
	go e.run()
	return e
}

func newHTTPExporter(cfg Config, ep endpoint, dial DialFunc, timeout time.Duration) (sdktrace.SpanExporter, error) {
	transport := &http.Transport{
		Proxy:                 nil, // a proxy would connect past the egress policy
		DialContext:           dial,
		ForceAttemptHTTP2:     true,
		TLSClientConfig:       &tls.Config{MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		MaxIdleConns:          2,
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       90 * time.Second,
	}
	exp, err := otlptracehttp.New(context.Background(),
		otlptracehttp.WithEndpointURL(ep.url),
		otlptracehttp.WithHTTPClient(&http.Client{Transport: transport, Timeout: timeout}),
		otlptracehttp.WithHeaders(cfg.Headers),
		otlptracehttp.WithTimeout(timeout),
		otlptracehttp.WithCompression(otlptracehttp.GzipCompression),
	)
	if err != nil {
		return nil, fmt.Errorf("cannot create OTLP/HTTP exporter for %q: %w", cfg.Endpoint, err)
	}
	return exp, nil
}

func newGRPCExporter(cfg Config, ep endpoint, dial DialFunc, timeout time.Duration) (sdktrace.SpanExporter, *grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if ep.tls {
		creds = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
	}
	// passthrough: gRPC hands host:port to the dialer as written instead of resolving it itself, so the
	// egress dialer checks the name and the addresses it resolves to.
	conn, err := grpc.NewClient("passthrough:///"+ep.hostPort,
		grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return dial(ctx, "tcp", addr)
		}),
		grpc.WithUserAgent("rolter"),
	)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot create gRPC connection to %q: %w", cfg.Endpoint, err)
	}
	exp, err := otlptracegrpc.New(context.Background(),
		otlptracegrpc.WithGRPCConn(conn),
		otlptracegrpc.WithHeaders(cfg.Headers),
		otlptracegrpc.WithTimeout(timeout),
		otlptracegrpc.WithCompressor("gzip"),
	)
	if err != nil {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("cannot create OTLP/gRPC exporter for %q: %w", cfg.Endpoint, err)
	}
	return exp, conn, nil
}

// Enabled reports whether e exports spans at all.
func (e *Exporter) Enabled() bool { return e != nil && e.on }

// Sampler returns the sampler of new traces (sample_ratio); a disabled Exporter's samples nothing.
func (e *Exporter) Sampler() Sampler {
	if e == nil {
		return Sampler{}
	}
	return e.sampler
}

// Record queues a copy of s for export and returns at once; s may be reused as soon as Record returns.
// A span whose context is not sampled is ignored. When the queue is full, or e is shut down, the span is
// dropped and counted (Dropped): a request never waits for the collector. Record does not allocate.
func (e *Exporter) Record(s *Span) {
	if e == nil || !e.on || !s.Context.Sampled() {
		return
	}
	if e.closed.Load() {
		e.dropped.Add(1)
		return
	}
	select {
	case e.q <- *s:
	default:
		e.dropped.Add(1)
	}
}

// Dropped returns how many sampled spans were dropped because the queue was full (or Record was called
// after Shutdown), for a rolter_tracing_spans_dropped_total counter.
func (e *Exporter) Dropped() uint64 {
	if e == nil {
		return 0
	}
	return e.dropped.Load()
}

// Exported returns how many spans the collector accepted.
func (e *Exporter) Exported() uint64 {
	if e == nil {
		return 0
	}
	return e.exported.Load()
}

// Failed returns how many spans were lost to failed exports (collector down, refused, timed out).
func (e *Exporter) Failed() uint64 {
	if e == nil {
		return 0
	}
	return e.failed.Load()
}

// Shutdown stops accepting spans, builds the queued ones, exports everything pending and closes the
// exporter's connections, within ctx: when ctx ends first, what is still queued is not exported.
// Calling it again returns the first result.
func (e *Exporter) Shutdown(ctx context.Context) error {
	if e == nil || !e.on {
		return nil
	}
	e.shutOnce.Do(func() {
		e.closed.Store(true)
		close(e.stop)
		select {
		case <-e.done:
		case <-ctx.Done():
			e.abandon.Store(true)
		}
		err := e.tp.Shutdown(ctx)
		if e.conn != nil {
			err = errors.Join(err, e.conn.Close())
		}
		if err != nil {
			e.shutErr = fmt.Errorf("cannot flush traces: %w", err)
		}
	})
	return e.shutErr
}

// run is the building goroutine.
func (e *Exporter) run() {
	defer close(e.done)
	for {
		select {
		case s := <-e.q:
			e.build(&s)
		case <-e.stop:
			for {
				select {
				case s := <-e.q:
					if e.abandon.Load() {
						continue
					}
					e.build(&s)
				default:
					return
				}
			}
		}
	}
}

// idsKey carries the ids a request decided to presetIDs.
type idsKey struct{}

type presetIDValues struct {
	trace trace.TraceID
	span  trace.SpanID
}

// presetIDs is the SDK's IDGenerator for spans whose ids were decided when the request arrived (they went
// upstream in traceparent before the span existed): it returns the ids put in the context by build.
type presetIDs struct{}

var _ sdktrace.IDGenerator = presetIDs{}

// NewIDs is called for a root span.
func (presetIDs) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	ids, ok := ctx.Value(idsKey{}).(presetIDValues)
	if !ok {
		panic("BUG: tracing: span started without preset ids")
	}
	return ids.trace, ids.span
}

// NewSpanID is called for a span with a (remote) parent, whose trace id the SDK takes from the parent.
func (presetIDs) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	ids, ok := ctx.Value(idsKey{}).(presetIDValues)
	if !ok {
		panic("BUG: tracing: span started without preset ids")
	}
	return ids.span
}

// Attribute keys: OpenTelemetry semantic conventions (HTTP server spans, error.type) where one exists,
// rolter.* for the routing.
const (
	attrMethod        = attribute.Key("http.request.method")
	attrStatus        = attribute.Key("http.response.status_code")
	attrPath          = attribute.Key("url.path")
	attrErrorType     = attribute.Key("error.type")
	attrRoute         = attribute.Key("rolter.route")
	attrModel         = attribute.Key("rolter.model")
	attrTarget        = attribute.Key("rolter.target")
	attrPrefillTarget = attribute.Key("rolter.prefill_target")
	attrStrategy      = attribute.Key("rolter.strategy")
	attrDecision      = attribute.Key("rolter.decision")
	attrScore         = attribute.Key("rolter.score")
	attrRetries       = attribute.Key("rolter.retries")
	attrRequestID     = attribute.Key("rolter.request_id")
	attrPromptTokens  = attribute.Key("rolter.prompt_tokens")
	attrCachedTokens  = attribute.Key("rolter.cached_tokens")
	attrRetry         = attribute.Key("rolter.retry")
)

// Event names.
const (
	EventFirstByte = "first_byte"
	EventRetry     = "retry"
)

// build turns s into an SDK span and ends it, which hands it to the batch processor. A panic loses that
// span only.
func (e *Exporter) build(s *Span) {
	defer func() {
		if p := recover(); p != nil {
			e.failed.Add(1)
			e.log.Error("panic while building a span", "panic", p, "stack", string(debug.Stack()))
		}
	}()
	ctx := context.WithValue(context.Background(), idsKey{}, presetIDValues{trace: s.Context.TraceID, span: s.Context.SpanID})
	if s.Parent != [8]byte{} {
		ctx = trace.ContextWithRemoteSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
			TraceID:    s.Context.TraceID,
			SpanID:     s.Parent,
			TraceFlags: trace.FlagsSampled,
			Remote:     true,
		}))
	}
	a := e.attrs[:0]
	str := func(k attribute.Key, v string) {
		if v != "" {
			a = append(a, k.String(v))
		}
	}
	str(attrMethod, s.Method)
	str(attrPath, s.Path)
	if s.Status != 0 {
		a = append(a, attrStatus.Int(s.Status))
	}
	str(attrRoute, s.Route)
	str(attrModel, s.Model)
	str(attrTarget, s.Target)
	str(attrPrefillTarget, s.PrefillTarget)
	str(attrStrategy, s.Strategy)
	str(attrDecision, s.Decision)
	if s.Score >= 0 {
		a = append(a, attrScore.Float64(s.Score))
	}
	a = append(a, attrRetries.Int(s.Retries))
	str(attrRequestID, string(s.RequestID[:s.RequestIDLen]))
	str(attrErrorType, s.Error)
	if s.PromptTokens >= 0 {
		a = append(a, attrPromptTokens.Int64(s.PromptTokens))
	}
	if s.CachedTokens >= 0 {
		a = append(a, attrCachedTokens.Int64(s.CachedTokens))
	}
	e.attrs = a

	name := s.Name
	if name == "" {
		name = s.Method + " " + s.Path
	}
	_, sp := e.tracer.Start(ctx, name,
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(s.Start),
		trace.WithAttributes(a...),
	)
	if !s.FirstByte.IsZero() {
		sp.AddEvent(EventFirstByte, trace.WithTimestamp(s.FirstByte))
	}
	for i, r := range s.RetryEvents {
		if r.Time.IsZero() {
			break
		}
		ev := []attribute.KeyValue{attrRetry.Int(i + 1)}
		if r.Target != "" {
			ev = append(ev, attrTarget.String(r.Target))
		}
		if r.Error != "" {
			ev = append(ev, attrErrorType.String(r.Error))
		}
		sp.AddEvent(EventRetry, trace.WithTimestamp(r.Time), trace.WithAttributes(ev...))
	}
	// A server span is an error for 5xx and for requests that failed without one (OpenTelemetry HTTP
	// semantic conventions: 4xx answers are the client's errors, not the server's).
	if s.Status >= 500 || s.Error != "" {
		sp.SetStatus(codes.Error, s.Error)
	}
	sp.End(trace.WithTimestamp(s.End))
}

// countingExporter counts exported and failed spans and logs failures itself, so they reach the
// gateway's log rather than OpenTelemetry's global error handler.
type countingExporter struct {
	sdktrace.SpanExporter
	e *Exporter
}

func (c *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := c.SpanExporter.ExportSpans(ctx, spans)
	if err == nil {
		c.e.exported.Add(uint64(len(spans)))
		return nil
	}
	c.e.failed.Add(uint64(len(spans)))
	c.e.warnMu.Lock()
	now := time.Now()
	warn := now.Sub(c.e.lastWarn) >= errorLogInterval
	if warn {
		c.e.lastWarn = now
	}
	c.e.warnMu.Unlock()
	if warn {
		c.e.log.Warn("trace export failed", "spans", len(spans), "err", err, "spans_lost_total", c.e.failed.Load())
	}
	return nil
}
