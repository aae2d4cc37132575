package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"reflect"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/accesslog"
	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/egress"
	"github.com/rolter-ai/rolter/promptkey"
	"github.com/rolter-ai/rolter/telemetry"
	"github.com/rolter-ai/rolter/tracing"
)

// Per-request records (docs/architecture.md, "Request logs and traces"): the access log ([log]) and
// OpenTelemetry traces ([tracing]). Both are the gateway's, like the routing trace: a reload that changes
// their section opens the new one, swaps it in, and closes the old one after it wrote what it queued. On
// the request path a record is a flat value copied into a bounded queue (accesslog.Logger.Log,
// tracing.Exporter.Record): 0 allocations, a full queue drops and counts, nothing blocks.
//
// Trace context: with tracing on, a request's W3C traceparent (or a new trace when it has none) gets the
// gateway's span as its child, and the upstream receives traceparent naming that span, so an engine's
// own spans (vLLM takes OpenTelemetry context) join the trace; tracestate is passed on unchanged. With
// tracing off both headers go upstream as the client sent them.

// observers are the gateway's access log and tracer with the config sections they were made from.
type observers struct {
	logCfg   accesslog.Config
	log      *accesslog.Logger // nil when [log] access is off
	traceCfg tracing.Config
	egress   egress.Config
	tracer   *tracing.Exporter // nil when [tracing] endpoint is ""
	set      *telemetry.Set    // their counters, registered while the observers are the gateway's
}

// openObservers returns the observers for cfg, keeping cur's logger and tracer where their sections are
// unchanged. What it opened anew is closed again by closeNew if the reload fails.
func (g *Gateway) openObservers(cfg *config.Config, cur *observers) (*observers, error) {
	o := &observers{logCfg: cfg.Log, traceCfg: cfg.Tracing, egress: cfg.Egress}
	if cur != nil && cur.logCfg == cfg.Log {
		o.log = cur.log
	} else if cfg.Log.Enabled() {
		l, err := accesslog.New(cfg.Log, g.log)
		if err != nil {
			return nil, fmt.Errorf("cannot open the access log: %w", err)
		}
		o.log = l
	}
	if cur != nil && reflect.DeepEqual(cur.traceCfg, cfg.Tracing) && reflect.DeepEqual(cur.egress, cfg.Egress) {
		o.tracer = cur.tracer
	} else if cfg.Tracing.Enabled() {
		policy, err := egress.New(cfg.Egress)
		if err != nil {
			o.closeNew(cur)
			return nil, fmt.Errorf("cannot use [egress]: %w", err)
		}
		d := g.egressDialer(policy, useTracing)
		t, err := tracing.New(cfg.Tracing, d.DialContext, g.log)
		if err != nil {
			o.closeNew(cur)
			return nil, fmt.Errorf("cannot start tracing: %w", err)
		}
		o.tracer = t
	}
	o.set = telemetry.NewSet()
	if l := o.log; l != nil {
		o.set.CounterFunc(telemetry.AccessLogLines, `result="written"`, l.Written)
		o.set.CounterFunc(telemetry.AccessLogLines, `result="dropped"`, l.Dropped)
		o.set.CounterFunc(telemetry.AccessLogLines, `result="write_failed"`, l.Failed)
	}
	if t := o.tracer; t != nil {
		o.set.CounterFunc(telemetry.TracingSpans, `result="exported"`, t.Exported)
		o.set.CounterFunc(telemetry.TracingSpans, `result="dropped"`, t.Dropped)
		o.set.CounterFunc(telemetry.TracingSpans, `result="export_failed"`, t.Failed)
	}
	return o, nil
}

// closeNew closes what o opened that cur does not hold.
func (o *observers) closeNew(cur *observers) {
	if o.log != nil && (cur == nil || o.log != cur.log) {
		_ = o.log.Close()
	}
	if o.tracer != nil && (cur == nil || o.tracer != cur.tracer) {
		shutdownTracer(o.tracer)
	}
}

// swapObservers makes o the gateway's and closes what the old ones held that o does not. Called under
// reloadMu.
func (g *Gateway) swapObservers(o *observers) {
	old := g.obs.Swap(o)
	if old != nil {
		old.set.Unregister()
	}
	if o != nil {
		o.set.Register()
	}
	if old != nil {
		if o == nil {
			o = &observers{}
		}
		old.closeNew(o)
	}
}

func shutdownTracer(t *tracing.Exporter) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = t.Shutdown(ctx)
}

// observe starts a request's records: its client address and, with tracing on, its trace context.
func (c *call) observe(ctx *fasthttp.RequestCtx) {
	o := c.g.obs.Load()
	if o == nil || (o.log == nil && o.tracer == nil) {
		return // c.obs stays nil: nothing is timed or recorded
	}
	c.obs = o
	if a, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		c.client = a.AddrPort()
	}
	if o.tracer == nil {
		return
	}
	parent, ok := tracing.ParseTraceparent(c.hdr.traceparent)
	c.trace = tracing.NewTraceContext(parent, ok, o.tracer.Sampler())
	c.traced = true
	if ok {
		c.traceParent = parent.SpanID
	}
}

// retried notes a retry for the request's span.
func (c *call) retried(t *Target, kind failKind) {
	if t != nil && c.traced && c.trace.Sampled() {
		c.span.AddRetry(time.Now(), t.Provider.Name, failKindLabels[kind])
	}
}

// errorClass names why a request failed, for the log and the span ("" when it did not).
func (c *call) errorClass(status int) string {
	switch {
	case status == statusClientClosed:
		return "client_gone"
	case c.streamFail != failNone:
		return streamFailLabels[c.streamFail]
	case c.lastFail != failNone && status >= 500:
		return failKindLabels[c.lastFail]
	case status >= 500:
		return "gateway"
	case status >= 400:
		return "client_error"
	}
	return ""
}

// recordEnd writes the request's access-log line and span. It runs once, when the request ends.
func (c *call) recordEnd(status int) {
	o := c.obs
	if o == nil {
		return
	}
	end := time.Now()
	d := end.Sub(c.start)
	errClass := c.errorClass(status)
	// Sampled or slow requests are logged, and every request the gateway answered with a 5xx.
	if o.log != nil && (o.log.Want(d, rand.Uint64()) || status >= 500) {
		r := &c.logRec
		r.Reset()
		r.Time = c.start
		r.SetRequestID(c.reqID)
		r.Client = c.client
		r.Path = c.logPath
		r.Status = status
		r.Retries = c.retries
		r.Duration = d
		r.BytesOut = c.bytesOut
		r.Stream = c.sse
		r.Error = errClass
		if c.route != nil {
			r.Route, r.Model, r.Strategy = c.route.Model, c.route.Model, c.route.StrategyName
			r.Decision, r.Score = c.decision.Reason.String(), c.decision.Score
		}
		if c.target != nil {
			r.Target = c.target.Provider.Name
		}
		if c.prefillT != nil {
			r.PrefillTarget = c.prefillT.Provider.Name
		}
		if !c.headersAt.IsZero() {
			r.UpstreamHeaders = c.headersAt.Sub(c.start)
		}
		if !c.firstAt.IsZero() {
			r.FirstByte = c.firstAt.Sub(c.start)
		}
		if u := &c.usage; u.found {
			r.PromptTokens = u.prompt
			if u.hasCached {
				r.CachedTokens = u.cached
			}
		}
		if c.traced {
			r.TraceID, r.SpanID = c.trace.TraceID, c.trace.SpanID
		}
		o.log.Log(r)
	}
	if o.tracer != nil && c.traced && c.trace.Sampled() {
		s := &c.span
		s.Context = c.trace
		s.Parent = c.traceParent
		s.Name = c.spanName
		s.Method, s.Path = c.method, c.logPath
		if s.Name == "" && s.Path == "" {
			s.Name = c.method
		}
		s.Start, s.End = c.start, end
		s.Status = status
		s.Retries = c.retries
		s.SetRequestID(c.reqID)
		s.Error = errClass
		s.Score = -1
		if c.route != nil {
			s.Route, s.Model, s.Strategy = c.route.Model, c.route.Model, c.route.StrategyName
			s.Decision, s.Score = c.decision.Reason.String(), c.decision.Score
		}
		if c.target != nil {
			s.Target = c.target.Provider.Name
		}
		if c.prefillT != nil {
			s.PrefillTarget = c.prefillT.Provider.Name
		}
		s.PromptTokens, s.CachedTokens = -1, -1
		if u := &c.usage; u.found {
			s.PromptTokens = u.prompt
			if u.hasCached {
				s.CachedTokens = u.cached
			}
		}
		s.FirstByte = c.firstAt
		o.tracer.Record(s)
	}
}

// resetObserve clears the request's records for the next request on the pooled call.
func (c *call) resetObserve() {
	c.obs = nil
	c.client = netip.AddrPort{}
	c.traced = false
	c.trace = tracing.TraceContext{}
	c.traceParent = [8]byte{}
	c.headersAt, c.firstAt = time.Time{}, time.Time{}
	c.lastFail = failNone
	c.span.Reset()
}

// streamFailLabels are the error classes of responses that failed after their first byte.
var streamFailLabels = func() (n [numFailKinds]string) {
	for i := range n {
		n[i] = "stream_" + failKindNames[i]
	}
	return n
}()

// spanNames are the spans' names, by endpoint: "POST /v1/chat/completions".
var spanNames = func() (n [promptkey.NumEndpoints]string) {
	for i := range n {
		n[i] = "POST " + promptkey.Endpoint(i).Path()
	}
	return n
}()

// loggedPath is the constant a request's records name its path by: the path of an endpoint or of one of
// the gateway's own, "/v1/*" for another proxied one, "" for any other path (a request's own bytes never
// reach a record).
func loggedPath(path []byte) string {
	switch string(path) {
	case "/v1/chat/completions":
		return promptkey.Chat.Path()
	case "/v1/completions":
		return promptkey.Completions.Path()
	case "/v1/embeddings":
		return promptkey.Embeddings.Path()
	case "/v1/responses":
		return promptkey.Responses.Path()
	case "/v1/messages":
		return promptkey.Messages.Path()
	case "/v1/models":
		return "/v1/models"
	case "/healthz":
		return "/healthz"
	case "/readyz":
		return "/readyz"
	case "/metrics":
		return "/metrics"
	}
	const models = "/v1/models/"
	switch {
	case len(path) > len(models) && string(path[:len(models)]) == models:
		return "/v1/models/*"
	case proxiedPath(path):
		return promptkey.Other.Path()
	}
	return ""
}

// methodName is the constant a request's span names its method by: the method for the ones HTTP defines,
// "_OTHER" (OpenTelemetry's name for the rest) otherwise.
func methodName(ctx *fasthttp.RequestCtx) string {
	switch string(ctx.Method()) {
	case "POST":
		return "POST"
	case "GET":
		return "GET"
	case "HEAD":
		return "HEAD"
	case "PUT":
		return "PUT"
	case "DELETE":
		return "DELETE"
	case "PATCH":
		return "PATCH"
	case "OPTIONS":
		return "OPTIONS"
	case "CONNECT":
		return "CONNECT"
	case "TRACE":
		return "TRACE"
	}
	return "_OTHER"
}

// appendTraceparent writes the upstream's traceparent: the request's trace, the gateway's span as the
// parent.
func (c *call) appendTraceparent(dst []byte) []byte { return tracing.AppendTraceparent(dst, c.trace) }
