package engine

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// One attempt, in order: send writes the request to a connection of the target's pool, head reads the
// response head (an error answer goes to upstreamError), succeed hands a successful response to the server,
// which streams it (stream.go); fail records a failed attempt and says whether to retry. The request itself
// ends in finish, after run or, for a streamed response, after CloseWithError.

// attempt forwards the request to target ti, whose slot admit took.
func (c *call) attempt(ctx *fasthttp.RequestCtx, ti int) (outcome, attemptResult) {
	t := c.route.Targets[ti]
	c.target = t
	conn, out, res := c.send(ctx, ti)
	if conn == nil {
		return out, res
	}
	if out, res, ok := c.head(ctx, conn, t); !ok {
		return out, res
	}
	return c.succeed(ctx, conn, t)
}

// send writes the request to a connection of target ti and waits until the answer can be read. It returns
// the connection, or nil and the attempt's outcome when the request was not sent.
func (c *call) send(ctx *fasthttp.RequestCtx, ti int) (*uconn, outcome, attemptResult) {
	t := c.target
	p := t.Provider
	conn, err := p.up.acquire()
	if err != nil {
		out, res := c.fail(ctx, t, nil, classifyAcquire(err), err)
		return nil, out, res
	}
	if c.watch.setVictim(conn) {
		// The client left while the request waited (for admission, or between attempts): it is not sent.
		c.watch.setVictim(nil)
		p.up.release(conn)
		out, res := c.clientLeft(ctx, t)
		return nil, out, res
	}
	for {
		c.sent = time.Now()
		// The headers deadline is set before the request is written: writeRequest waits for the answer.
		_ = conn.rd.SetAfter(c.sent, p.up.headersWait, conn.nc.SetReadDeadline)
		if c.route.recorder != nil && !c.recorded && c.hop != hopDecode {
			c.routedTarget = ti
			conn.onSent = c.routedHook
		}
		err = c.writeRequest(ctx, conn, t)
		conn.onSent = nil
		if err == nil {
			return conn, 0, attemptResult{}
		}
		conn.close()
		kind := classify(err)
		if conn.reused {
			// Writing to a pooled connection failed: the upstream had closed it and did not take the
			// request whole, so it processed nothing. Resend once on a fresh connection; this is not a retry.
			t.m.UpstreamError(int(failStale))
			if conn, err = p.up.dialConn(); err == nil {
				c.watch.setVictim(conn)
				continue
			}
			kind = classifyAcquire(err)
		}
		c.watch.setVictim(nil)
		out, res := c.fail(ctx, t, nil, kind, err)
		return nil, out, res
	}
}

// head reads the response head. It reports true for a response to pass on as it comes (succeed), and
// otherwise the outcome of the attempt, which it has answered or failed.
func (c *call) head(ctx *fasthttp.RequestCtx, conn *uconn, t *Target) (outcome, attemptResult, bool) {
	resp := &conn.resp
	resp.StreamBody = true
	if err := resp.ReadLimitBody(conn.br, 0); err != nil {
		conn.close()
		c.watch.setVictim(nil)
		if c.watch.gone.Load() {
			out, res := c.clientLeft(ctx, t)
			return out, res, false
		}
		kind := classify(err)
		if conn.reused && staleConnError(err) {
			// The upstream closed a pooled connection after the request was written to it. It may have read
			// and even processed the request, so resending is a retry like any other - counted, capped by
			// retry.max_retries and shown in x-rolter-retries - though not held against the target's health:
			// keep-alive races are nobody's failure.
			kind = failStale
		}
		out, res := c.fail(ctx, t, nil, kind, err)
		return out, res, false
	}
	c.status = resp.StatusCode()
	t.m.Headers.UpdateDuration(c.sent)
	if c.obs != nil {
		c.headersAt = time.Now()
	}
	if c.status < 200 {
		// fasthttp skips 100 Continue, 103 Early Hints and other interim answers; what is left is a 101
		// Switching Protocols (or garbage) to a plain POST. What follows on the connection is not HTTP.
		conn.close()
		c.watch.setVictim(nil)
		out, res := c.fail(ctx, t, nil, failProto, errUnexpectedStatus)
		return out, res, false
	}
	if c.status >= 400 {
		out, res := c.upstreamError(ctx, conn, t)
		return out, res, false
	}
	return 0, attemptResult{}, true
}

// upstreamError handles an upstream's error answer: a 5xx or 429 fails the attempt (to be retried), a 508
// is this gateway's own loop answer, any other 4xx is the client's and passed on, normalised.
func (c *call) upstreamError(ctx *fasthttp.RequestCtx, conn *uconn, t *Target) (outcome, attemptResult) {
	c.watch.setVictim(nil)
	e := c.readUpstreamError(conn, t)
	if c.status == fasthttp.StatusLoopDetected {
		// A gateway upstream saw the request come back (loop.go): so would every retry. Passed on as this
		// gateway's own answer, and no failure of the target's health.
		e = loopDetected("the request came back to a gateway it passed through: a provider of this route reaches the gateway itself")
	} else if c.status >= 500 || c.status == fasthttp.StatusTooManyRequests {
		if ra := retryAfterMs(&conn.resp.Header); ra > 0 && c.status == fasthttp.StatusTooManyRequests {
			// Relayed, but never longer than the gateway itself would wait on a 429.
			e.retryAfterMs = min(ra, int(c.snap.cfg.Cooldown.MaxRetryAfterSecs*1000))
		}
		kind := failStatus
		if c.status >= 500 && c.status != 502 && c.status != 503 && c.status != 504 {
			kind = failAnswered
		}
		return c.fail(ctx, t, e, kind, nil)
	}
	// A client error is the client's: pass it on (normalised), do not retry elsewhere.
	c.watch.disarm()
	c.done(t, failNone, 0)
	c.writeError(ctx, e)
	return outDone, attemptResult{}
}

// succeed passes a successful response on: a body-less one at once; otherwise, once a non-streaming body
// was read ahead (prefetch), the body goes to the server, which streams it to the client through c.Read.
func (c *call) succeed(ctx *fasthttp.RequestCtx, conn *uconn, t *Target) (outcome, attemptResult) {
	resp := &conn.resp
	c.bodyStream = resp.BodyStream()
	if c.bodyStream == nil {
		// 204/304: no body. release closes the connection if the upstream sent one anyway.
		c.watch.disarm()
		if resp.ConnectionClose() {
			conn.close()
		} else {
			t.Provider.up.release(conn)
		}
		c.done(t, failNone, 0)
		ctx.Response.SetStatusCode(c.status)
		c.answerHeaders(ctx)
		return outDone, attemptResult{}
	}
	ct := resp.Header.ContentType()
	c.sse = bytes.HasPrefix(ct, []byte("text/event-stream"))
	conn.startBody()
	c.conn = conn
	size := resp.Header.ContentLength()
	kind, err := failNone, error(nil)
	if c.sse {
		// Chunked towards the client whatever the upstream framing, so a failed stream can still end with an
		// error event.
		size = -1
		if c.hop == hopDecode && len(c.kvParams) > 0 {
			kind, err = c.holdFirstEvent()
		}
	} else {
		kind, err = c.prefetch()
	}
	if c.hop == hopDecode && c.prefillT != nil && c.pdUsage.hasCached && kind == failNone {
		n := rewriteCached(c.respBuf[:cap(c.respBuf)], len(c.respBuf), c.pdUsage.cached)
		c.respBuf = c.respBuf[:n]
	}
	if kind != failNone {
		// A non-streaming body that breaks off before its end is a failed attempt, answered (or retried)
		// like one - not a status line followed by a truncated body; so is a decode stream whose first event
		// is an error (holdFirstEvent).
		c.conn, c.bodyStream, c.upstreamDone, c.respBuf = nil, nil, false, c.respBuf[:0]
		conn.close()
		c.watch.setVictim(nil)
		if c.watch.gone.Load() {
			return c.clientLeft(ctx, t)
		}
		return c.fail(ctx, t, nil, kind, err)
	}
	if !c.sse && c.upstreamDone {
		size = len(c.respBuf)
	}
	c.record(t, failNone, 0) // the slot stays taken until the streamed body is closed (CloseWithError)
	c.respond(ctx, conn, ct, size)
	return outStreaming, attemptResult{}
}

// respond starts the answer of a successful response: the status, the upstream's headers but hop-by-hop
// ones, the answer's own (answerHeaders), and the body stream of size bytes (-1: unknown) the server reads
// from c.
func (c *call) respond(ctx *fasthttp.RequestCtx, conn *uconn, ct []byte, size int) {
	c.watch.startResponse()
	ctx.Response.SetStatusCode(c.status)
	for k, v := range conn.resp.Header.All() {
		if !skipResponseHeader(k) {
			ctx.Response.Header.AddBytesKV(k, v)
		}
	}
	ctx.Response.Header.SetContentTypeBytes(ct)
	c.answerHeaders(ctx)
	if c.upstreamDone {
		// Read whole: the connection can serve the next request while this answer is written.
		c.releaseConn(true)
	}
	if size < 0 && !ctx.Request.Header.IsHTTP11() {
		// HTTP/1.0 has no chunked encoding: the body is sent as it comes and ends with the connection.
		c.streamHTTP10(ctx)
		return
	}
	if c.sse && conn.br.Buffered() == 0 {
		// Send status and headers before the first token: a long prefill must not look like a dead gateway.
		// When the first event came with the upstream's headers, they leave together in one write instead.
		ctx.Response.ImmediateHeaderFlush = true
	}
	ctx.Response.SetBodyStream(c, size)
}

// errUnexpectedStatus is the failure of an upstream that answered a plain request with a 1xx final status.
var errUnexpectedStatus = errors.New("unexpected informational status")

// maxPrefetch is how much of a non-streaming body is read before the response starts. Bodies up to this size
// (every chat or completion answer) are answered only once they arrived whole; larger ones (big embedding
// batches) start streaming after that much.
const maxPrefetch = 1 << 20

// prefetch reads the start of a non-streaming body into c.respBuf: all of it when it is at most maxPrefetch
// (then c.upstreamDone is set). It returns failNone, or what broke the body off.
func (c *call) prefetch() (failKind, error) {
	c.respBuf = c.respBuf[:0]
	for {
		more, err := c.readMore(maxPrefetch)
		switch {
		case err == io.EOF:
			return failNone, nil
		case err != nil:
			return classify(err), err
		case !more:
			return failNone, nil
		}
	}
}

// readMore reads the next bytes of the upstream's body onto c.respBuf, which grows as the bytes come, up to
// limit bytes and inside the gateway's body memory. It reports false, reading nothing, when the buffer is
// at limit or the body memory is spent (the rest of the body then streams through instead of being read
// ahead); err is the read's, and io.EOF sets c.upstreamDone.
func (c *call) readMore(limit int) (bool, error) {
	buf := c.respBuf
	if len(buf) >= limit {
		return false, nil
	}
	if len(buf) == cap(buf) {
		n := min(max(2*cap(buf), 4<<10), limit)
		if !c.hold(n - cap(buf)) {
			return false, nil
		}
		nb := make([]byte, len(buf), n)
		copy(nb, buf)
		buf = nb
	}
	n, err := c.bodyStream.Read(buf[len(buf):cap(buf)])
	c.respBuf = buf[:len(buf)+n]
	if err == io.EOF {
		c.upstreamDone = true
	}
	return true, err
}

// releaseConn gives the upstream connection back once its response was read whole (reusable), or closes it.
func (c *call) releaseConn(reusable bool) {
	conn := c.conn
	if conn == nil {
		return
	}
	c.conn = nil
	c.watch.setVictim(nil)
	resp := &conn.resp
	_ = resp.CloseBodyStream()
	if reusable && !resp.ConnectionClose() {
		conn.up.release(conn)
	} else {
		conn.close()
	}
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

// fail records a failed attempt and decides whether to retry: every failure is retried (outRetry, with
// what to answer if no retry succeeds) but a timeout, which is answered at once.
func (c *call) fail(ctx *fasthttp.RequestCtx, t *Target, e *apiError, kind failKind, err error) (outcome, attemptResult) {
	var retryAfter time.Duration
	if e != nil && e.status == fasthttp.StatusTooManyRequests {
		retryAfter = time.Duration(e.retryAfterMs) * time.Millisecond
	}
	c.done(t, kind, retryAfter)
	c.lastFail = kind
	t.m.UpstreamError(int(kind))
	if e == nil {
		status, code := fasthttp.StatusBadGateway, "upstream_error"
		if kind == failTimeout {
			status, code = fasthttp.StatusGatewayTimeout, "upstream_timeout"
		}
		// The client learns what kind of failure it was, never its details (addresses, socket pairs, bytes
		// the upstream sent): those are logged.
		e = &apiError{status: status, typ: typeForStatus(status), code: code, message: failMessages[kind]}
	}
	detail := ""
	if err != nil {
		detail = err.Error()
	}
	c.g.log.Debug("upstream attempt failed", "request_id", string(c.reqID), "route", c.route.Model,
		"target", t.Provider.Name, "kind", kind.String(), "status", e.status, "message", e.message, "error", detail)
	if kind == failTimeout && c.hop != hopPrefill {
		// A timed-out generation may still be running upstream; sending it elsewhere doubles the work and the
		// client's wait. Answer 504 now. (A prefill that timed out has generated nothing: another one may do.)
		c.writeError(ctx, e)
		return outDone, attemptResult{}
	}
	return outRetry, attemptResult{kind: kind, err: e}
}

// failMessages are what a client is told of a failed attempt, by kind.
var failMessages = [numFailKinds]string{
	failNone:     "the upstream failed",
	failConnect:  "cannot connect to the upstream",
	failTimeout:  "the upstream timed out",
	failReset:    "the upstream closed the connection",
	failStatus:   "the upstream failed",
	failProto:    "the upstream sent an invalid response",
	failClient:   "the client closed the connection",
	failStale:    "the upstream closed the connection",
	failBusy:     "the upstream has too many open connections",
	failAnswered: "the upstream failed",
	failEgress:   "the egress policy refuses the upstream's address",
}

// clientLeft ends a request whose client disconnected while the upstream was working: 499, no retry.
// t is nil when the client left before an attempt took a slot. Nothing is written back: the connection is
// closed, so a client that is in fact still there (a half-close the probe could not tell apart) never reads
// a success status with an empty body.
func (c *call) clientLeft(ctx *fasthttp.RequestCtx, t *Target) (outcome, attemptResult) {
	c.watch.disarm()
	if t != nil {
		c.done(t, failClient, 0)
	}
	c.route.m.ClientGone.Inc()
	c.status = statusClientClosed
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(net.Conn) {})
	return outDone, attemptResult{}
}

// statusClientClosed is recorded when the client went away first (nginx and Caddy's convention).
const statusClientClosed = 499

// routed records the prompt as sent to target c.routedTarget, in the winner's trie: it runs once the
// request is written, before the wait for the answer (see uconn.flushAndWait), so the requests of a burst
// see where the first ones went.
func (c *call) routed() {
	ti := c.routedTarget
	c.route.recorder.Routed(&c.pick, ti)
	c.recorded = true
	if p := &c.pick; p.cpsDone && len(p.cps) > 0 {
		p.peers.Routed(c.route.Targets[ti].peerID, p.cps)
	}
}

var reasonBytes = func() (b [numReasons][]byte) {
	for i := range b {
		b[i] = []byte(Reason(i).String())
	}
	return b
}()

// answerHeaders sets the headers every answer to the client carries, an error (writeError) or the
// upstream's (succeed): X-Request-Id, the request's id (requestID, once per request in begin) - the one
// place the client's answer gets it - and, once the request is routed, the x-rolter-* decision headers
// (docs/routing/README.md, "Decision headers").
func (c *call) answerHeaders(ctx *fasthttp.RequestCtx) {
	h := &ctx.Response.Header
	h.SetCanonical(hdrRequestID, c.reqID)
	c.limitHeaders(h)
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
	if c.prefillT != nil && c.hop == hopDecode {
		h.SetCanonical(hdrPrefillTarget, c.prefillT.Provider.nameBytes)
	} else if c.skip != skipNone {
		h.SetCanonical(hdrPrefillSkipped, skipNames[c.skip])
	}
	if c.retries > 0 {
		var num [8]byte
		h.SetCanonical(hdrRetries, strconv.AppendInt(num[:0], int64(c.retries), 10))
	}
}
