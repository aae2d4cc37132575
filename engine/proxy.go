package engine

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/rolter-ai/rolter/kvindex"
)

// call is the state of one proxied request. It is pooled: acquired when a request arrives and released
// when its response is finished - after the handler returns for a streamed body, since it is the body
// stream the server reads (Read + CloseWithError, libraries.md section 1 "Metering").
type call struct {
	g      *Gateway
	snap   *Snapshot
	route  *Route
	target *Target
	ep     endpoint
	parser fastjson.Parser

	bodyLen  int    // size of the client body, to keep huge-request state out of the pool
	key      []byte // prompt key
	body     []byte // body with the target's model spliced in
	path     []byte // upstream request path
	reqID    []byte
	pick     Pick
	eligible [maxTargets]int
	order    [maxTargets]int
	nOrder   int
	tried    uint64
	decision Decision
	retries  int
	// failingOpen: no target was eligible; the ranking is every target, least bad first.
	failingOpen bool
	// probe: the current attempt is a half-open breaker probe.
	probe bool
	// recorded: the strategy has been told where the request went.
	recorded bool

	start time.Time
	sent  time.Time

	// The upstream response being streamed.
	conn         *uconn
	bodyStream   io.Reader
	status       int
	sse          bool
	gotFirst     bool
	upstreamDone bool
	streamFail   failKind
	pendingErr   error  // a read error held back so data read with it is written first
	pending      []byte // bytes still to send before EOF (an SSE error event)
	tail         []byte // the last bytes sent, to see an SSE stream's [DONE] and event boundaries
	bytesOut     int64
	closed       bool

	watch  clientWatch
	errBuf []byte

	tokens    []uint32 // x-rolter-vllm-token-ids
	kvScratch kvindex.Scratch
	kvOut     [kvindex.MaxTargets]int
	tmp       [maxTargets]int
}

var callPool sync.Pool

func (g *Gateway) acquireCall(snap *Snapshot) *call {
	c, _ := callPool.Get().(*call)
	if c == nil {
		c = &call{tail: make([]byte, 0, 32)}
	}
	c.g = g
	c.snap = snap
	return c
}

func (c *call) release() {
	c.g.inflight.Add(-1)
	c.g, c.snap, c.route, c.target = nil, nil, nil, nil
	c.failingOpen, c.probe, c.recorded = false, false, false
	c.pick = Pick{}
	c.tried, c.nOrder, c.retries = 0, 0, 0
	c.conn, c.bodyStream = nil, nil
	c.status, c.sse, c.gotFirst, c.upstreamDone = 0, false, false, false
	c.streamFail, c.pendingErr, c.pending = failNone, nil, nil
	c.tail = c.tail[:0]
	c.bytesOut, c.closed = 0, false
	// A call that handled a huge request keeps its parser's buffer and value cache and its own buffers at
	// that size; pooling it would pin them (libraries.md section 2, fastjson PR #45), so it goes to the GC.
	if c.bodyLen > 1<<20 || cap(c.tokens) > 1<<18 || cap(c.errBuf) > 64<<10 {
		return
	}
	callPool.Put(c)
}

// Request header names the gateway never forwards: hop-by-hop headers (RFC 9110 section 7.6.1), the ones it
// writes itself, and its own x-rolter-* controls.
func skipRequestHeader(k []byte) bool {
	switch len(k) {
	case 2:
		return equalFold(k, "te")
	case 4:
		return equalFold(k, "host")
	case 6:
		return equalFold(k, "expect")
	case 7:
		return equalFold(k, "trailer") || equalFold(k, "upgrade")
	case 10:
		return equalFold(k, "connection") || equalFold(k, "keep-alive")
	case 12:
		return equalFold(k, "x-request-id")
	case 14:
		return equalFold(k, "content-length")
	case 15:
		return equalFold(k, "accept-encoding")
	case 17:
		return equalFold(k, "transfer-encoding")
	}
	return hasPrefixFold(k, "proxy-") || hasPrefixFold(k, "x-rolter-")
}

// skipResponseHeader lists upstream response headers the gateway does not copy.
func skipResponseHeader(k []byte) bool {
	switch len(k) {
	case 2:
		return equalFold(k, "te")
	case 4:
		return equalFold(k, "date")
	case 7:
		return equalFold(k, "trailer") || equalFold(k, "upgrade")
	case 10:
		return equalFold(k, "connection") || equalFold(k, "keep-alive")
	case 12:
		return equalFold(k, "content-type") || equalFold(k, "x-request-id")
	case 14:
		return equalFold(k, "content-length")
	case 17:
		return equalFold(k, "transfer-encoding")
	}
	return hasPrefixFold(k, "proxy-")
}

func equalFold(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

func hasPrefixFold(b []byte, lower string) bool {
	return len(b) >= len(lower) && equalFold(b[:len(lower)], lower)
}

// outcome of one attempt.
type outcome uint8

const (
	outStreaming outcome = iota // the response is being streamed to the client
	outDone                     // the response is written (an upstream 4xx passed on, or the client left)
	outRetry                    // failed before anything reached the client; try the next target
)

// attemptResult describes a failed attempt.
type attemptResult struct {
	kind failKind
	err  *apiError // what to answer if no retry succeeds
}

// run sends the request to the ranked targets until one answers, retrying connect errors, resets and
// 5xx/429 answers on the next candidate - only before any byte reached the client, never after the client
// left (../shared/STYLE.md habit 7). A candidate that became ineligible meanwhile (just marked down, cooling,
// circuit open) is skipped, as is one whose concurrency cap and wait queue are full.
func (c *call) run(ctx *fasthttp.RequestCtx) {
	cfg := &c.snap.cfg.Retry
	var last attemptResult
	sent := 0
	for k := 0; sent <= cfg.MaxRetries; k++ {
		ti := c.nextTarget(k)
		if ti < 0 {
			break
		}
		t := c.route.Targets[ti]
		if !c.admit(t) {
			last = attemptResult{kind: failBusy, err: c.busyError(t)}
			continue
		}
		if sent > 0 {
			c.retries++
			c.route.m.Retries.Inc()
			if sent == 1 {
				c.route.m.Retried.Inc()
			}
			if d := backoff(cfg, sent); d > 0 {
				time.Sleep(d)
			}
		}
		sent++
		out, res := c.attempt(ctx, ti)
		switch out {
		case outStreaming:
			return
		case outDone:
			c.finishUnstreamed(ctx)
			return
		}
		last = res
	}
	e := last.err
	if e == nil {
		e = &apiError{status: fasthttp.StatusBadGateway, typ: typeServer, code: "upstream_error", message: "no upstream target answered"}
	} else if e.status >= 500 || e.status == 0 {
		// Every candidate failed; the client sees one gateway error that says what the last one did.
		status := fasthttp.StatusBadGateway
		code := "upstream_error"
		if last.kind == failTimeout {
			status, code = fasthttp.StatusGatewayTimeout, "upstream_timeout"
		}
		e = &apiError{status: status, typ: typeForStatus(status), code: code, message: e.message}
	}
	c.setDecisionHeaders(ctx)
	writeError(ctx, e)
	c.status = e.status
	c.finishUnstreamed(ctx)
}

// admit takes a concurrency slot on t (waiting in its bounded queue if it has one) and asks its breaker
// whether a request may go through. On success the provider's in-flight count includes this request.
func (c *call) admit(t *Target) bool {
	p := t.Provider
	ok, probe := true, false
	if !c.failingOpen { // failing open means trying the least-bad target, open breaker or not
		ok, probe = p.health.admit(c.pick.Now)
	}
	if !ok {
		return false
	}
	if !p.adm.acquire(&p.inflight) {
		if probe {
			p.health.brProbes.Add(-1)
		}
		c.g.global.Admission("target")
		return false
	}
	c.probe = probe
	return true
}

// done releases t's slot and records the attempt's outcome for cooldowns and the breaker.
func (c *call) done(t *Target, kind failKind, retryAfter time.Duration) {
	p := t.Provider
	p.adm.release(&p.inflight)
	c.record(t, kind, retryAfter)
}

// record reports the attempt's outcome to t's cooldown and breaker state.
func (c *call) record(t *Target, kind failKind, retryAfter time.Duration) {
	p := t.Provider
	switch kind {
	case failNone:
		p.health.success(c.probe)
	case failClient, failBusy:
		if c.probe {
			p.health.brProbes.Add(-1)
		}
	default:
		p.health.failure(time.Now().UnixNano(), c.probe, kind, retryAfter)
	}
	c.probe = false
}

func (c *call) busyError(t *Target) *apiError {
	ms := int(c.snap.cfg.Queue.RetryAfterSecs * 1000)
	return &apiError{status: fasthttp.StatusTooManyRequests, typ: typeRateLimit, code: "queue_full",
		message:      "every candidate target of model " + c.route.Model + " is at its concurrency limit and wait queue; retry later",
		retryAfterMs: ms}
}

func backoff(cfg *RetryConfig, attempt int) time.Duration {
	if cfg.BackoffMs <= 0 {
		return 0
	}
	ms := cfg.BackoffMs * float64(uint(1)<<min(attempt-1, 16))
	ms = min(ms, cfg.MaxBackoffMs)
	// Full jitter halves the chance that many requests retry in lockstep.
	ms = ms/2 + rand.Float64()*ms/2
	return time.Duration(ms * float64(time.Millisecond))
}

// nextTarget returns the k-th candidate: the strategy's ranking first, then the least-loaded eligible
// targets not tried yet; targets that turned ineligible since the ranking are skipped (unless failing open).
// -1 when none is left.
func (c *call) nextTarget(k int) int {
	now := time.Now().UnixNano()
	for ; k < c.nOrder; k++ {
		t := c.order[k]
		if c.tried&(1<<t) != 0 {
			continue
		}
		c.tried |= 1 << t
		if c.failingOpen || c.route.Targets[t].Provider.health.eligible(now) {
			return t
		}
	}
	best, bestLoad := -1, int64(0)
	for _, i := range c.pick.Eligible {
		if c.tried&(1<<i) != 0 || !(c.failingOpen || c.route.Targets[i].Provider.health.eligible(now)) {
			continue
		}
		if l := c.route.Targets[i].Load(); best < 0 || l < bestLoad {
			best, bestLoad = i, l
		}
	}
	if best >= 0 {
		c.tried |= 1 << best
		if c.nOrder < maxTargets {
			c.order[c.nOrder] = best
			c.nOrder++
		}
	}
	return best
}

// attempt forwards the request to target ti, whose slot admit took.
func (c *call) attempt(ctx *fasthttp.RequestCtx, ti int) (outcome, attemptResult) {
	t := c.route.Targets[ti]
	p := t.Provider
	c.target = t
	body := c.bodyFor(ctx, t)

	conn, err := p.up.acquire()
	if err != nil {
		return c.failAttempt(ctx, t, nil, classifyAcquire(err), err)
	}
	for {
		c.sent = time.Now()
		if err = c.writeRequest(ctx, conn, t, body); err == nil {
			if c.route.recorder != nil && !c.recorded {
				// "After forwarding, record the prompt in the winner's trie" (seed page): at send time, not
				// when the answer comes back, so the requests of a burst see where the first ones went.
				c.route.recorder.Routed(&c.pick, ti)
				c.recorded = true
			}
			_ = conn.nc.SetReadDeadline(c.sent.Add(p.up.headersWait))
			c.watch.arm(ctx.Conn(), c.g.watchDelay, conn)
			resp := &conn.resp
			resp.StreamBody = true
			err = resp.ReadLimitBody(conn.br, 0)
			if err != nil && c.watch.disarm() {
				conn.close()
				return c.clientLeft(ctx, t)
			}
		}
		if err == nil {
			break
		}
		conn.close()
		if conn.reused && staleConnError(err) {
			// The provider closed a pooled connection before reading the request (keep-alive expiry):
			// nothing was processed, so resend on a fresh connection without counting a retry.
			t.m.UpstreamError(int(failStale))
			if conn, err = p.up.dialConn(); err != nil {
				return c.failAttempt(ctx, t, nil, classifyAcquire(err), err)
			}
			continue
		}
		return c.failAttempt(ctx, t, nil, classify(err), err)
	}

	resp := &conn.resp
	c.status = resp.StatusCode()
	t.m.Headers.UpdateDuration(c.sent)
	if c.status >= 400 {
		c.watch.disarm()
		e := c.readUpstreamError(conn, t)
		if c.status >= 500 || c.status == fasthttp.StatusTooManyRequests {
			if ra := retryAfterMs(&resp.Header); ra > 0 && c.status == fasthttp.StatusTooManyRequests {
				e.retryAfterMs = ra
			}
			return c.failAttempt(ctx, t, e, failStatus, nil)
		}
		// A client error is the client's: pass it on (normalised), do not retry elsewhere.
		c.done(t, failNone, 0)
		c.setDecisionHeaders(ctx)
		writeError(ctx, e)
		return outDone, attemptResult{}
	}
	c.record(t, failNone, 0) // the slot stays taken until the streamed body is closed (CloseWithError)

	// Success: hand the body to the server, which streams it to the client through c.Read.
	c.conn = conn
	c.bodyStream = resp.BodyStream()
	if c.bodyStream == nil {
		// 204/304: no body to stream.
		if resp.ConnectionClose() {
			conn.close()
		} else {
			conn.up.release(conn)
		}
		p.adm.release(&p.inflight)
		c.conn = nil
		ctx.Response.SetStatusCode(c.status)
		c.setDecisionHeaders(ctx)
		return outDone, attemptResult{}
	}
	ct := resp.Header.ContentType()
	c.sse = bytes.HasPrefix(ct, []byte("text/event-stream"))
	conn.startBody()
	ctx.Response.SetStatusCode(c.status)
	for k, v := range resp.Header.All() {
		if !skipResponseHeader(k) {
			ctx.Response.Header.AddBytesKV(k, v)
		}
	}
	ctx.Response.Header.SetContentTypeBytes(ct)
	c.setDecisionHeaders(ctx)
	if c.sse {
		// Send status and headers before the first token: a long prefill must not look like a dead gateway.
		ctx.Response.ImmediateHeaderFlush = true
	}
	if c.route.recorder != nil {
		c.route.recorder.Routed(&c.pick, ti)
	}
	size := resp.Header.ContentLength()
	if c.sse {
		// Chunked towards the client whatever the upstream framing, so a failed stream can still end with an
		// error event.
		size = -1
	}
	ctx.Response.SetBodyStream(c, size)
	return outStreaming, attemptResult{}
}

func classifyAcquire(err error) failKind {
	if errors.Is(err, errTooManyConns) {
		return failBusy
	}
	return classify(err)
}

// staleConnError reports a pooled connection that was closed by the peer before any response byte.
func staleConnError(err error) bool {
	return err == io.EOF || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// failAttempt records a failed attempt and decides whether to retry.
func (c *call) failAttempt(ctx *fasthttp.RequestCtx, t *Target, e *apiError, kind failKind, err error) (outcome, attemptResult) {
	var retryAfter time.Duration
	if e != nil && e.status == fasthttp.StatusTooManyRequests {
		retryAfter = time.Duration(e.retryAfterMs) * time.Millisecond
	}
	c.done(t, kind, retryAfter)
	t.m.UpstreamError(int(kind))
	if e == nil {
		status, code := fasthttp.StatusBadGateway, "upstream_error"
		if kind == failTimeout {
			status, code = fasthttp.StatusGatewayTimeout, "upstream_timeout"
		}
		msg := "upstream " + t.Provider.Name + " failed: " + kind.String()
		if err != nil {
			msg += ": " + err.Error()
		}
		e = &apiError{status: status, typ: typeForStatus(status), code: code, message: msg}
	}
	c.g.log.Debug("upstream attempt failed", "request_id", string(c.reqID), "route", c.route.Model,
		"target", t.Provider.Name, "kind", kind.String(), "status", e.status, "message", e.message)
	if kind == failTimeout {
		// A timed-out generation may still be running upstream; sending it elsewhere doubles the work and the
		// client's wait. Answer 504 now.
		c.setDecisionHeaders(ctx)
		writeError(ctx, e)
		c.status = e.status
		return outDone, attemptResult{}
	}
	return outRetry, attemptResult{kind: kind, err: e}
}

// clientLeft ends a request whose client disconnected while the upstream was working: 499, no retry.
func (c *call) clientLeft(ctx *fasthttp.RequestCtx, t *Target) (outcome, attemptResult) {
	c.done(t, failClient, 0)
	c.route.m.ClientGone.Inc()
	c.status = statusClientClosed
	ctx.SetConnectionClose()
	return outDone, attemptResult{}
}

// statusClientClosed is recorded when the client went away first (nginx and Caddy's convention).
const statusClientClosed = 499

// bodyFor returns the body to send to t: the client's, with the value of "model" replaced by t.Model (as a
// JSON string) unless it already is that; the rest is forwarded byte for byte.
func (c *call) bodyFor(ctx *fasthttp.RequestCtx, t *Target) []byte {
	body := ctx.PostBody()
	start, end := topLevelValue(body, "model")
	if bytes.Equal(body[start:end], t.modelJSON) {
		return body
	}
	c.body = append(c.body[:0], body[:start]...)
	c.body = append(c.body, t.modelJSON...)
	c.body = append(c.body, body[end:]...)
	return c.body
}

// writeRequest writes the upstream request. Client headers are passed on except hop-by-hop ones; the
// provider's key replaces the client's Authorization when api_key_env is set.
func (c *call) writeRequest(ctx *fasthttp.RequestCtx, conn *uconn, t *Target, body []byte) error {
	p := t.Provider
	_ = conn.nc.SetWriteDeadline(time.Now().Add(p.up.headersWait))
	bw := conn.bw
	c.path = p.up.requestPath(c.path[:0], ctx.Path())
	if qs := ctx.URI().QueryString(); len(qs) > 0 {
		c.path = append(c.path, '?')
		c.path = append(c.path, qs...)
	}
	bw.WriteString("POST ")
	bw.Write(c.path)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(p.up.hostHeader)
	bw.WriteString("\r\n")
	hasCT := false
	for k, v := range ctx.Request.Header.All() {
		if skipRequestHeader(k) || (p.auth != nil && equalFold(k, "authorization")) {
			continue
		}
		if equalFold(k, "content-type") {
			hasCT = true
		}
		writeHeader(bw, k, v)
	}
	if !hasCT {
		bw.WriteString("Content-Type: application/json\r\n")
	}
	if p.auth != nil {
		bw.WriteString("Authorization: ")
		bw.Write(p.auth)
		bw.WriteString("\r\n")
	}
	for _, h := range p.headers {
		bw.WriteString(h[0])
		bw.WriteString(": ")
		bw.WriteString(h[1])
		bw.WriteString("\r\n")
	}
	bw.WriteString("X-Request-Id: ")
	bw.Write(c.reqID)
	bw.WriteString("\r\nContent-Length: ")
	var num [20]byte
	bw.Write(strconv.AppendInt(num[:0], int64(len(body)), 10))
	bw.WriteString("\r\n\r\n")
	bw.Write(body)
	return bw.Flush()
}

func writeHeader(bw interface {
	Write([]byte) (int, error)
	WriteString(string) (int, error)
}, k, v []byte) {
	bw.Write(k)
	bw.WriteString(": ")
	bw.Write(v)
	bw.WriteString("\r\n")
}

// readUpstreamError reads (at most 64 KiB of) an upstream error body, returns the connection to the pool
// when the body was read whole, and normalises the body to OpenAI's error shape.
func (c *call) readUpstreamError(conn *uconn, t *Target) *apiError {
	resp := &conn.resp
	conn.startBody()
	c.errBuf = c.errBuf[:0]
	r := resp.BodyStream()
	complete := false
	if r == nil {
		complete = true
	} else {
		var buf [4096]byte
		for len(c.errBuf) < 64<<10 {
			n, err := r.Read(buf[:])
			c.errBuf = append(c.errBuf, buf[:n]...)
			if err == io.EOF {
				complete = true
				break
			}
			if err != nil {
				break
			}
		}
	}
	e := normaliseUpstreamError(c.status, c.errBuf, t.Provider.Name)
	closing := resp.ConnectionClose()
	_ = resp.CloseBodyStream()
	if complete && !closing {
		conn.up.release(conn)
	} else {
		conn.close()
	}
	return e
}

func retryAfterMs(h *fasthttp.ResponseHeader) int {
	if v := h.Peek("Retry-After-Ms"); len(v) > 0 {
		if ms, err := strconv.ParseFloat(string(v), 64); err == nil && ms > 0 {
			return int(ms)
		}
	}
	if v := h.Peek("Retry-After"); len(v) > 0 {
		if s, err := strconv.ParseFloat(string(v), 64); err == nil && s > 0 {
			return int(s * 1000)
		}
		if t, err := time.Parse(time.RFC1123, string(v)); err == nil {
			if d := time.Until(t); d > 0 {
				return int(d / time.Millisecond)
			}
		}
	}
	return 0
}

// Header names, already in canonical form so fasthttp does not normalise them per request.
var (
	hdrRequestID   = []byte("X-Request-Id")
	hdrRoute       = []byte("X-Rolter-Route")
	hdrStrategy    = []byte("X-Rolter-Strategy")
	hdrDecision    = []byte("X-Rolter-Decision")
	hdrPrefixMatch = []byte("X-Rolter-Prefix-Match")
	hdrProvider    = []byte("X-Rolter-Provider")
	hdrTarget      = []byte("X-Rolter-Target")
	hdrRetries     = []byte("X-Rolter-Retries")
)

var reasonBytes = func() (b [numReasons][]byte) {
	for i := range b {
		b[i] = []byte(Reason(i).String())
	}
	return b
}()

// setDecisionHeaders adds the x-rolter-* headers (../shared/DESIGN.md section 2).
func (c *call) setDecisionHeaders(ctx *fasthttp.RequestCtx) {
	h := &ctx.Response.Header
	h.SetCanonical(hdrRequestID, c.reqID)
	if !c.snap.cfg.Server.ExposeDecisionHeaders || c.route == nil {
		return
	}
	h.SetCanonical(hdrRoute, c.route.modelBytes)
	h.SetCanonical(hdrStrategy, c.route.strategyHeader)
	h.SetCanonical(hdrDecision, reasonBytes[c.decision.Reason])
	if c.decision.Score >= 0 {
		var num [24]byte
		h.SetCanonical(hdrPrefixMatch, strconv.AppendFloat(num[:0], c.decision.Score, 'f', 4, 64))
	}
	if c.target != nil {
		h.SetCanonical(hdrProvider, c.target.Provider.nameBytes)
		h.SetCanonical(hdrTarget, c.target.Provider.nameBytes)
	}
	if c.retries > 0 {
		var num [8]byte
		h.SetCanonical(hdrRetries, strconv.AppendInt(num[:0], int64(c.retries), 10))
	}
}

// finishUnstreamed records a request whose response is not a streamed upstream body, and releases c.
func (c *call) finishUnstreamed(ctx *fasthttp.RequestCtx) {
	if c.status == 0 {
		c.status = ctx.Response.StatusCode()
	}
	if c.target != nil {
		c.target.m.Request(c.status)
		c.target.m.Duration.UpdateDuration(c.start)
	} else if c.route != nil {
		c.route.m.UnroutedRequest(c.status)
	}
	c.release()
}

// Read is the body stream the server copies to the client. Each upstream read is returned as is, so the
// server writes and flushes it as one chunk: SSE events reach the client as the engine produces them.
// A stream that fails after its first byte ends with an SSE error event and no [DONE]
// (../shared/DESIGN.md section 2); a non-SSE body that fails ends with an error, so the server closes the
// connection and the client sees a truncated response rather than a clean one.
func (c *call) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	if c.pendingErr != nil {
		return 0, c.endWithError(c.pendingErr)
	}
	if c.streamFail != failNone {
		return 0, io.EOF
	}
	if c.upstreamDone {
		return c.endOfStream()
	}
	n, err := c.bodyStream.Read(p)
	if n > 0 {
		if !c.gotFirst {
			c.gotFirst = true
			c.target.m.TTFB.UpdateDuration(c.sent)
		}
		c.bytesOut += int64(n)
		c.keepTail(p[:n])
		if err != nil && err != io.EOF {
			c.pendingErr = err
		} else if err == io.EOF {
			c.upstreamDone = true
		}
		return n, nil
	}
	if err == nil {
		return 0, nil
	}
	if err == io.EOF {
		c.upstreamDone = true
		return c.endOfStream()
	}
	return 0, c.endWithError(err)
}

// endOfStream ends a body the upstream finished cleanly.
func (c *call) endOfStream() (int, error) {
	if c.sse && !c.sawDone() {
		// The upstream ended the body but the SSE stream never finished: a truncated stream must not look
		// like a successful one (gateway-anchors.md section 4, LiteLLM and Bifrost reports).
		return c.sseError(failReset, "upstream stream ended before its last event")
	}
	return 0, io.EOF
}

func (c *call) endWithError(err error) error {
	kind := classify(err)
	if c.watch.gone.Load() {
		kind = failClient
	}
	if c.sse {
		msg := "upstream stream failed: " + kind.String()
		if kind == failTimeout {
			msg = "upstream stream stalled longer than timeouts.idle_secs"
		}
		_, e := c.sseError(kind, msg)
		return e
	}
	c.streamFail = kind
	return err
}

// sseError queues a final `data: {"error":...}` event and returns its first bytes.
func (c *call) sseError(kind failKind, msg string) (int, error) {
	c.streamFail = kind
	status, code := fasthttp.StatusBadGateway, "upstream_stream_error"
	if kind == failTimeout {
		status, code = fasthttp.StatusGatewayTimeout, "upstream_timeout"
	}
	e := apiError{status: status, typ: typeServer, code: code, message: msg}
	var ev []byte
	if !c.atEventBoundary() {
		ev = append(ev, "\n\n"...)
	}
	ev = append(ev, "data: "...)
	ev = e.appendBody(ev)
	ev = append(ev, "\n\n"...)
	c.pending = ev
	return 0, nil
}

func (c *call) keepTail(b []byte) {
	const keep = 32
	if len(b) >= keep {
		c.tail = append(c.tail[:0], b[len(b)-keep:]...)
		return
	}
	if over := len(c.tail) + len(b) - keep; over > 0 {
		c.tail = append(c.tail[:0], c.tail[over:]...)
	}
	c.tail = append(c.tail, b...)
}

func (c *call) sawDone() bool {
	return bytes.Contains(c.tail, []byte("data: [DONE]")) || bytes.Contains(c.tail, []byte("data:[DONE]"))
}

func (c *call) atEventBoundary() bool {
	return len(c.tail) == 0 || bytes.HasSuffix(c.tail, []byte("\n\n")) || bytes.HasSuffix(c.tail, []byte("\r\n\r\n"))
}

// CloseWithError is called by the server once the response is written (err == nil) or failed (err is the
// write error, typically the client having gone away). It returns the upstream connection to the pool only
// when its response was read whole; otherwise it closes it, which tells the engine to stop generating.
func (c *call) CloseWithError(err error) error {
	if c.closed {
		return nil
	}
	c.closed = true
	gone := c.watch.disarm()
	conn := c.conn
	resp := &conn.resp
	_ = resp.CloseBodyStream()
	reusable := c.upstreamDone && c.streamFail == failNone && err == nil && !gone && !resp.ConnectionClose()
	if reusable {
		conn.up.release(conn)
	} else {
		conn.close()
	}
	p := c.target.Provider
	p.adm.release(&p.inflight)
	if c.streamFail != failNone && c.streamFail != failClient && !(err != nil || gone) {
		p.health.failure(time.Now().UnixNano(), false, c.streamFail, 0)
	}
	status := c.status
	switch {
	case err != nil || gone || c.streamFail == failClient:
		status = statusClientClosed
		c.route.m.ClientGone.Inc()
	case c.streamFail != failNone:
		c.target.m.StreamError(int(c.streamFail))
		status = fasthttp.StatusBadGateway
	}
	c.target.m.Request(status)
	c.target.m.Duration.UpdateDuration(c.start)
	c.target.m.ResponseBytes.Add(int(c.bytesOut))
	c.release()
	return nil
}

var _ fasthttp.ReadCloserWithError = (*call)(nil)
