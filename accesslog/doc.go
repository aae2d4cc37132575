// Package accesslog is the gateway's per-request access log: one line per finished request,
// written off the request path.
//
// The engine fills a Record when a request ends, asks Logger.Want whether to log it (sample fraction, and
// slow_ms, which always logs slow requests), and hands it to Logger.Log, which copies it into a bounded
// queue without blocking and without allocating. A full queue drops the line and counts it
// (Logger.Dropped, exported as rolter_access_log_dropped_total). One writer goroutine formats the lines
// into a reused buffer and writes them to the destination (logfile: stdout, stderr or a rotated file)
// whenever the queue is empty, at 64 KiB, and at least every 100 ms.
//
// No prompt text, no header and no key ever reaches a Record: it has no field for them. Values that come
// from outside - the client's request id, and names the operator chose - are escaped, so none can forge
// a second line or a field.
//
// # Fields
//
// In this order; JSON writes every key (null when unknown), text leaves unknown ones out.
//
//	time                 arrival time, RFC 3339 in UTC with milliseconds ("2026-11-25T10:00:00.123Z")
//	request_id           x-request-id, echoed or generated
//	client               client address and port ("10.0.0.7:51234", "[2001:db8::1]:443")
//	path                 endpoint ("/v1/chat/completions")
//	route                route that served the request
//	model                public model name the client asked for
//	target               provider of the last attempt
//	strategy             the route's strategy ("cache_aware")
//	decision             the strategy's reason, as x-rolter-decision ("prefix_hit")
//	score                winning prefix-match fraction 0..1, 4 decimals (null unless a cache strategy decided)
//	status               HTTP status sent to the client (499: the client left first)
//	retries              attempts after the first
//	upstream_headers_ms  arrival to the upstream's response headers, ms with 3 decimals
//	first_byte_ms        arrival to the first body byte sent to the client, ms with 3 decimals
//	duration_ms          arrival to the end of the response, ms with 3 decimals
//	bytes_out            response body bytes written to the client
//	prompt_tokens        usage.prompt_tokens, when the response reported it
//	cached_tokens        usage.prompt_tokens_details.cached_tokens, when the response reported it
//	stream               whether the client asked for SSE
//	error                error class of a failed request ("upstream_5xx", "timeout", "client_gone", "egress")
//	trace_id             W3C trace id, 32 hex digits, when the request has a trace context
//	span_id              the gateway's span id, 16 hex digits
//
// A JSON line (one line in the file):
//
//	{"time":"2026-11-25T10:00:00.123Z","request_id":"req-7f3a","client":"10.0.0.7:51234","path":"/v1/chat/completions","route":"llama","model":"llama","target":"vllm-2","strategy":"cache_aware","decision":"prefix_hit","score":0.8125,"status":200,"retries":0,"upstream_headers_ms":41.250,"first_byte_ms":41.913,"duration_ms":1873.004,"bytes_out":18342,"prompt_tokens":2048,"cached_tokens":1664,"stream":true,"error":null,"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","span_id":"00f067aa0ba902b7"}
//
// The same request as text:
//
//	time=2026-11-25T10:00:00.123Z request_id=req-7f3a client=10.0.0.7:51234 path=/v1/chat/completions route=llama model=llama target=vllm-2 strategy=cache_aware decision=prefix_hit score=0.8125 status=200 retries=0 upstream_headers_ms=41.250 first_byte_ms=41.913 duration_ms=1873.004 bytes_out=18342 prompt_tokens=2048 cached_tokens=1664 stream=true trace_id=4bf92f3577b34da6a3ce929d0e0e4736 span_id=00f067aa0ba902b7
//
// A text value is written bare when it is printable ASCII without space, '=', '"' or '\', and otherwise
// quoted with JSON's escapes (logfmt). Both formats escape control characters, quotes, backslashes, DEL,
// C1 controls, U+2028/U+2029 and bidirectional overrides, and turn invalid UTF-8 into \ufffd.
package accesslog
