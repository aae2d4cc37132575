// Package tracing is the gateway's distributed tracing: W3C trace context in and out, and one
// OpenTelemetry span per request exported over OTLP.
//
// # Trace context
//
// ParseTraceparent reads a caller's traceparent (W3C Trace Context level 1); NewTraceContext makes the
// gateway's own span in the caller's trace, or in a new one, with the sampled flag decided once per trace
// (parent-based; a new trace by Sampler, OpenTelemetry's TraceIDRatioBased rule); AppendTraceparent
// writes the traceparent the gateway sends upstream, whose parent id is the gateway's span, so a vLLM
// started with OpenTelemetry tracing puts its spans under the gateway's. tracestate is forwarded as it
// came when ValidTracestate accepts it, and dropped with an invalid traceparent. None of these allocate.
//
// # Export
//
// The engine fills a Span when a request ends and calls Exporter.Record, which copies it into a bounded
// queue without blocking or allocating, or drops and counts it (Exporter.Dropped). One goroutine builds
// the OpenTelemetry span through the SDK - with the ids decided when the request arrived (a preset
// IDGenerator) and the request's own timestamps - and a batch span processor exports batches over
// OTLP/HTTP (protobuf, gzip) or OTLP/gRPC (gzip), through the dial function the engine gives New (its
// egress policy).
//
// Span: kind server, name "POST /v1/chat/completions", attributes http.request.method, url.path,
// http.response.status_code, rolter.route, rolter.model, rolter.target, rolter.strategy,
// rolter.decision, rolter.score, rolter.retries, rolter.request_id, rolter.prompt_tokens,
// rolter.cached_tokens and error.type (each when known); status Error for 5xx answers and failed
// requests; events first_byte, and retry (rolter.retry = 1, 2, ..., with the failed attempt's
// rolter.target and error.type) for the first MaxRetryEvents retries. Resource: service.name.
//
// # Pointing it at a collector
//
//	[tracing]
//	endpoint = "http://otel-collector:4318"   # OTLP/HTTP; /v1/traces is added
//	# endpoint = "grpc://otel-collector:4317" # OTLP/gRPC (grpcs:// for TLS)
//	sample_ratio = 0.1                        # of new traces; callers' sampled traces are always kept
//	headers = { "authorization" = "Bearer ..." }
//
// The collector's host must be allowed by [egress] (a collector on the loopback or a private address
// needs allow_hosts or allow_cidrs when block_loopback or block_private is on).
package tracing
