package accesslog

import (
	"net/netip"
	"time"
)

// MaxRequestID is the longest request id a Record holds: the longest x-request-id the gateway echoes.
// A longer id is cut to this length.
const MaxRequestID = 128

// Record is one finished request, as the engine hands it to Logger.Log. It is a flat value: Log copies
// it, so the caller may reuse its Record at once. The only references it holds are strings, and they must
// be immutable and owned by the process, not by the request (route, model, target, strategy and decision
// names from the config snapshot, constants for the path and the error class): a string that aliases a
// request buffer would be read by the writer goroutine after the buffer was reused. Bytes from the
// request (the request id) are copied into the Record.
//
// The zero Record means "nothing known" except for Score, PromptTokens and CachedTokens, whose unknown
// value is -1: start from Reset.
type Record struct {
	// Time is when the request arrived.
	Time time.Time
	// RequestID holds the request id (x-request-id, echoed or generated); RequestIDLen bytes of it are
	// used. Set it with SetRequestID.
	RequestID    [MaxRequestID]byte
	RequestIDLen uint8
	// Client is the client's address and port (the zero value: unknown).
	Client netip.AddrPort
	// Path is the endpoint, e.g. "/v1/chat/completions": an engine constant, never the raw request URI.
	Path string
	// Route is the route that served the request, Model the public model name the client asked for.
	Route string
	Model string
	// Target is the provider the last attempt went to ("" if none was tried); on a disaggregated route,
	// the decode engine, and PrefillTarget the prefill engine whose blocks it used ("" if none).
	Target        string
	PrefillTarget string
	// Strategy is the route's strategy, Decision its one-word reason (x-rolter-decision), Score the
	// winning prefix-match fraction 0..1 or -1 when no cache strategy decided.
	Strategy string
	Decision string
	Score    float64
	// Status is the status sent to the client (499 when the client left first; 0: none).
	Status int
	// Retries is how many attempts were made after the first.
	Retries int
	// UpstreamHeaders, FirstByte and Duration are measured from Time: until the upstream's response
	// headers, until the first body byte reached the client, until the request ended. 0: not reached.
	UpstreamHeaders time.Duration
	FirstByte       time.Duration
	Duration        time.Duration
	// BytesOut is the number of response body bytes written to the client.
	BytesOut int64
	// PromptTokens and CachedTokens are usage.prompt_tokens and usage.prompt_tokens_details.cached_tokens
	// when the response reported them, else -1.
	PromptTokens int64
	CachedTokens int64
	// Stream is whether the client asked for a stream (SSE).
	Stream bool
	// Error is the error class when the request failed ("" on success): "upstream_5xx", "timeout",
	// "client_gone", "egress", ...
	Error string
	// TraceID and SpanID are the request's trace context (the gateway's span); zero when there is none.
	TraceID [16]byte
	SpanID  [8]byte
}

// Reset sets r to an empty record: every field zero, and Score, PromptTokens and CachedTokens -1.
func (r *Record) Reset() {
	*r = Record{Score: -1, PromptTokens: -1, CachedTokens: -1}
}

// SetRequestID copies id (at most MaxRequestID bytes of it) into r.
func (r *Record) SetRequestID(id []byte) {
	r.RequestIDLen = uint8(copy(r.RequestID[:], id))
}

// RequestIDBytes returns the request id held by r; valid while r is unchanged.
func (r *Record) RequestIDBytes() []byte { return r.RequestID[:r.RequestIDLen] }
