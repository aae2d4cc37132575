package tracing

import "time"

// MaxRetryEvents is how many retries of a request its span records as events.
const MaxRetryEvents = 8

// MaxRequestID is the longest request id a Span holds: the longest x-request-id the gateway echoes.
const MaxRequestID = 128

// Span is one request as the engine hands it to Exporter.Record: the gateway's server span. It is a flat
// value: Record copies it, so the caller may reuse its Span at once. The only references it holds are
// strings, and they must be immutable and owned by the process, not by the request (names from the
// config snapshot, constants for the method, path and error classes); bytes from the request (the request
// id) are copied in.
//
// The zero Span means "nothing known" except for Score, PromptTokens and CachedTokens, whose unknown
// value is -1: start from Reset.
type Span struct {
	// Context is the gateway's span (NewTraceContext): its trace id, its own span id, and the sampled
	// flag. Only sampled spans are exported.
	Context TraceContext
	// Parent is the caller's span id from its traceparent; zero: the gateway's span is the trace's root.
	Parent [8]byte
	// Name is the span name; "" means Method + " " + Path ("POST /v1/chat/completions").
	Name   string
	Method string
	Path   string
	// Start and End are when the request arrived and when it ended.
	Start time.Time
	End   time.Time
	// Status is the HTTP status sent to the client (0: none).
	Status int
	// Route, Model (the public model name), Target (provider of the last attempt), Strategy, Decision
	// and Score (winning prefix-match fraction, -1 when no cache strategy decided) describe the routing.
	Route  string
	Model  string
	Target string
	// PrefillTarget is a disaggregated route's prefill engine ("" if none), Target its decode engine.
	PrefillTarget string
	Strategy      string
	Decision      string
	Score         float64
	// Retries is how many attempts were made after the first.
	Retries int
	// RequestID holds the request id; RequestIDLen bytes of it are used. Set it with SetRequestID.
	RequestID    [MaxRequestID]byte
	RequestIDLen uint8
	// Error is the error class of a failed request ("" on success), exported as error.type.
	Error string
	// PromptTokens and CachedTokens are the usage the response reported, else -1.
	PromptTokens int64
	CachedTokens int64
	// FirstByte is when the first body byte reached the client (zero: never).
	FirstByte time.Time
	// RetryEvents are the first MaxRetryEvents retries, in order; unused entries have a zero Time.
	RetryEvents [MaxRetryEvents]RetryEvent
}

// RetryEvent is one retry: when it was decided, and the target and error class of the attempt that failed.
type RetryEvent struct {
	Time   time.Time
	Target string
	Error  string
}

// Reset sets s to an empty span: every field zero, and Score, PromptTokens and CachedTokens -1.
func (s *Span) Reset() {
	*s = Span{Score: -1, PromptTokens: -1, CachedTokens: -1}
}

// SetRequestID copies id (at most MaxRequestID bytes of it) into s.
func (s *Span) SetRequestID(id []byte) {
	s.RequestIDLen = uint8(copy(s.RequestID[:], id))
}

// AddRetry records a retry event; past MaxRetryEvents it does nothing (Retries still counts them).
func (s *Span) AddRetry(at time.Time, target, errorClass string) {
	for i := range s.RetryEvents {
		if s.RetryEvents[i].Time.IsZero() {
			s.RetryEvents[i] = RetryEvent{Time: at, Target: target, Error: errorClass}
			return
		}
	}
}
