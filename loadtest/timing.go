package loadtest

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// SeqHeader is the request header vegeta numbers every request with (lib/attack.go hit()); the
// timing transport keys its records by it.
const SeqHeader = "X-Vegeta-Seq"

// IndexHeader carries the harness's own request number (plan index) from the targeter to the
// transport, so a vegeta result can be matched to the request the targeter built.
const IndexHeader = "X-Loadtest-Index"

// Timing is what the transport saw of one request. Start is when RoundTrip was called, Header
// when the response headers arrived, FirstByte when the first non-empty body read returned, End
// when the body hit EOF or was closed. Zero times did not happen.
type Timing struct {
	Index     int
	Start     time.Time
	Header    time.Time
	FirstByte time.Time
	End       time.Time
}

// TTFB returns FirstByte − Start, or 0 when no body byte came.
func (t *Timing) TTFB() time.Duration {
	if t.FirstByte.IsZero() {
		return 0
	}
	return t.FirstByte.Sub(t.Start)
}

// Latency returns End − Start, or 0 when the body did not end.
func (t *Timing) Latency() time.Duration {
	if t.End.IsZero() {
		return 0
	}
	return t.End.Sub(t.Start)
}

// TimingTransport wraps an http.RoundTripper and records a Timing per request, keyed by the
// X-Vegeta-Seq header. Requests without that header are passed through untimed. When Context
// is set, requests run under it, so cancelling it aborts requests in flight (vegeta's Stop only
// stops new ones).
//
// The Timing of a request is written by the goroutine reading its body; Take it only after that
// goroutine is done with the body (vegeta delivers the Result after closing the body, which
// orders the two). TimingTransport is safe for concurrent use.
type TimingTransport struct {
	Base    http.RoundTripper
	Context context.Context

	mu      sync.Mutex
	records map[uint64]*Timing
}

// RoundTrip implements http.RoundTripper.
func (t *TimingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	seqText := req.Header.Get(SeqHeader)
	if t.Context != nil {
		req = req.WithContext(mergeContexts(req.Context(), t.Context))
	}
	if seqText == "" {
		return t.Base.RoundTrip(req)
	}
	seq, err := strconv.ParseUint(seqText, 10, 64)
	if err != nil {
		return t.Base.RoundTrip(req)
	}
	tm := &Timing{Index: -1, Start: time.Now()}
	if s := req.Header.Get(IndexHeader); s != "" {
		if n, err := strconv.Atoi(s); err == nil {
			tm.Index = n
		}
	}
	t.mu.Lock()
	if t.records == nil {
		t.records = map[uint64]*Timing{}
	}
	t.records[seq] = tm
	t.mu.Unlock()
	resp, err := t.Base.RoundTrip(req)
	now := time.Now()
	if err != nil {
		tm.End = now
		return nil, err
	}
	tm.Header = now
	resp.Body = &timedBody{ReadCloser: resp.Body, tm: tm}
	return resp, nil
}

// Take returns and forgets the Timing of request seq.
func (t *TimingTransport) Take(seq uint64) (*Timing, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tm, ok := t.records[seq]
	delete(t.records, seq)
	return tm, ok
}

// timedBody notes the first non-empty read and the end of the body.
type timedBody struct {
	io.ReadCloser
	tm *Timing
}

func (b *timedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 && b.tm.FirstByte.IsZero() {
		b.tm.FirstByte = time.Now()
	}
	if err != nil && b.tm.End.IsZero() {
		b.tm.End = time.Now()
	}
	return n, err
}

func (b *timedBody) Close() error {
	if b.tm.End.IsZero() {
		b.tm.End = time.Now()
	}
	return b.ReadCloser.Close()
}

// mergeContexts returns a context done when either a or b is done; it keeps a's values.
func mergeContexts(a, b context.Context) context.Context {
	if a.Done() == nil {
		return b
	}
	ctx, cancel := context.WithCancel(a)
	stop := context.AfterFunc(b, cancel)
	// The merged context lives as long as the request; release the AfterFunc once a is done too.
	context.AfterFunc(ctx, func() { stop() })
	return ctx
}
