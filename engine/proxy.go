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

// attempt forwards the request to target ti, whose slot admit took.
func (c *call) attempt(ctx *fasthttp.RequestCtx, ti int) (outcome, attemptResult) {
	t := c.route.Targets[ti]
	p := t.Provider
	c.target = t

	conn, err := p.up.acquire()
	if err != nil {
		return c.failAttempt(ctx, t, nil, classifyAcquire(err), err)
	}
	if c.watch.setVictim(conn) {
		// The client left while the request waited (for admission, or between attempts): it is not sent.
		c.watch.setVictim(nil)
		p.up.release(conn)
		return c.clientLeft(ctx, t)
	}
	for {
		c.sent = time.Now()
		// The headers deadline is set before the request is written: writeRequest waits for the answer.
		_ = conn.rd.SetAfter(c.sent, p.up.headersWait, conn.nc.SetReadDeadline)
		if c.route.recorder != nil && !c.recorded {
			c.routedTarget = ti
			conn.onSent = c.routedHook
		}
		err = c.writeRequest(ctx, conn, t)
		conn.onSent = nil
		if err == nil {
			break
		}
		conn.close()
		if !conn.reused {
			c.watch.setVictim(nil)
			return c.failAttempt(ctx, t, nil, classify(err), err)
		}
		// Writing to a pooled connection failed: the upstream had closed it and did not take the request
		// whole, so it processed nothing. Resend once on a fresh connection; this is not a retry.
		t.m.UpstreamError(int(failStale))
		if conn, err = p.up.dialConn(); err != nil {
			c.watch.setVictim(nil)
			return c.failAttempt(ctx, t, nil, classifyAcquire(err), err)
		}
		c.watch.setVictim(conn)
	}
	resp := &conn.resp
	resp.StreamBody = true
	err = resp.ReadLimitBody(conn.br, 0)
	if err != nil {
		conn.close()
		c.watch.setVictim(nil)
		if c.watch.gone.Load() {
			return c.clientLeft(ctx, t)
		}
		if conn.reused && staleConnError(err) {
			// The upstream closed a pooled connection after the request was written to it. It may have read
			// and even processed the request, so resending is a retry like any other - counted, capped by
			// retry.max_retries and shown in x-rolter-retries - though not held against the target's health:
			// keep-alive races are nobody's failure.
			return c.failAttempt(ctx, t, nil, failStale, err)
		}
		return c.failAttempt(ctx, t, nil, classify(err), err)
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
		return c.failAttempt(ctx, t, nil, failProto, errUnexpectedStatus)
	}
	if c.status >= 400 {
		c.watch.setVictim(nil)
		e := c.readUpstreamError(conn, t)
		if c.status == fasthttp.StatusLoopDetected {
			// A gateway upstream saw the request come back (loop.go): so would every retry. Passed on as
			// this gateway's own answer, and no failure of the target's health.
			e = loopDetected("the request came back to a gateway it passed through: a provider of this route reaches the gateway itself")
			c.watch.disarm()
			c.done(t, failNone, 0)
			c.setDecisionHeaders(ctx)
			writeError(ctx, e)
			return outDone, attemptResult{}
		}
		if c.status >= 500 || c.status == fasthttp.StatusTooManyRequests {
			if ra := retryAfterMs(&resp.Header); ra > 0 && c.status == fasthttp.StatusTooManyRequests {
				// Relayed, but never longer than the gateway itself would wait on a 429.
				e.retryAfterMs = min(ra, int(c.snap.cfg.Cooldown.MaxRetryAfterSecs*1000))
			}
			kind := failStatus
			if c.status >= 500 && c.status != 502 && c.status != 503 && c.status != 504 {
				kind = failAnswered
			}
			return c.failAttempt(ctx, t, e, kind, nil)
		}
		// A client error is the client's: pass it on (normalised), do not retry elsewhere.
		c.watch.disarm()
		c.done(t, failNone, 0)
		c.setDecisionHeaders(ctx)
		writeError(ctx, e)
		return outDone, attemptResult{}
	}

	c.bodyStream = resp.BodyStream()
	if c.bodyStream == nil {
		// 204/304: no body. release closes the connection if the upstream sent one anyway.
		c.watch.disarm()
		if resp.ConnectionClose() {
			conn.close()
		} else {
			p.up.release(conn)
		}
		c.done(t, failNone, 0)
		ctx.Response.SetStatusCode(c.status)
		c.setDecisionHeaders(ctx)
		return outDone, attemptResult{}
	}
	ct := resp.Header.ContentType()
	c.sse = bytes.HasPrefix(ct, []byte("text/event-stream"))
	conn.startBody()
	c.conn = conn
	size := resp.Header.ContentLength()
	if c.sse {
		// Chunked towards the client whatever the upstream framing, so a failed stream can still end with an
		// error event.
		size = -1
	} else if kind, err := c.prefetch(); kind != failNone {
		// A non-streaming body that breaks off before its end is a failed attempt, answered (or retried)
		// like one - not a status line followed by a truncated body.
		c.conn, c.bodyStream = nil, nil
		conn.close()
		c.watch.setVictim(nil)
		if c.watch.gone.Load() {
			return c.clientLeft(ctx, t)
		}
		return c.failAttempt(ctx, t, nil, kind, err)
	} else if c.upstreamDone {
		size = len(c.respBuf)
	}
	c.record(t, failNone, 0) // the slot stays taken until the streamed body is closed (CloseWithError)

	// Success: hand the body to the server, which streams it to the client through c.Read.
	c.watch.startResponse()
	ctx.Response.SetStatusCode(c.status)
	for k, v := range resp.Header.All() {
		if !skipResponseHeader(k) {
			ctx.Response.Header.AddBytesKV(k, v)
		}
	}
	ctx.Response.Header.SetContentTypeBytes(ct)
	c.setDecisionHeaders(ctx)
	if c.upstreamDone {
		// Read whole: the connection can serve the next request while this answer is written.
		c.releaseConn(true)
	}
	if size < 0 && !ctx.Request.Header.IsHTTP11() {
		// HTTP/1.0 has no chunked encoding: the body is sent as it comes and ends with the connection.
		c.streamHTTP10(ctx)
		return outStreaming, attemptResult{}
	}
	if c.sse && conn.br.Buffered() == 0 {
		// Send status and headers before the first token: a long prefill must not look like a dead gateway.
		// When the first event came with the upstream's headers, they leave together in one write instead.
		ctx.Response.ImmediateHeaderFlush = true
	}
	ctx.Response.SetBodyStream(c, size)
	return outStreaming, attemptResult{}
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
	buf := c.respBuf[:0]
	for len(buf) < maxPrefetch {
		if len(buf) == cap(buf) {
			// Grown as the bytes come, and inside the gateway's body memory: when that is spent the rest of
			// the body streams through instead of being read ahead.
			n := min(max(2*cap(buf), 4<<10), maxPrefetch)
			if !c.hold(n - cap(buf)) {
				break
			}
			nb := make([]byte, len(buf), n)
			copy(nb, buf)
			buf = nb
		}
		n, err := c.bodyStream.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			c.upstreamDone = true
			break
		}
		if err != nil {
			c.respBuf = buf
			return classify(err), err
		}
	}
	c.respBuf = buf
	return failNone, nil
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

// streamHTTP10 sends the response to an HTTP/1.0 client whose body length is unknown: without chunked
// encoding, as the bytes come, ending with the connection. It takes the connection over from the server.
func (c *call) streamHTTP10(ctx *fasthttp.RequestCtx) {
	h := &ctx.Response.Header
	var head []byte
	head = append(head, "HTTP/1.0 "...)
	head = strconv.AppendInt(head, int64(c.status), 10)
	head = append(head, ' ')
	head = append(head, fasthttp.StatusMessage(c.status)...)
	head = append(head, "\r\n"...)
	for k, v := range h.All() {
		if equalFold(k, "connection") || equalFold(k, "transfer-encoding") || equalFold(k, "content-length") {
			continue
		}
		head = append(head, k...)
		head = append(head, ": "...)
		head = append(head, v...)
		head = append(head, "\r\n"...)
	}
	head = append(head, "Connection: close\r\n\r\n"...)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(nc net.Conn) {
		_, err := nc.Write(head)
		buf := make([]byte, 16<<10)
		for err == nil {
			var n int
			n, err = c.Read(buf)
			if n > 0 {
				if _, werr := nc.Write(buf[:n]); werr != nil {
					err = werr
				}
			}
		}
		if err == io.EOF {
			err = nil
		}
		_ = c.CloseWithError(err)
	})
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

// routed records the prompt as sent to target c.routedTarget. "After forwarding, record the prompt in the
// winner's trie" (seed page): it runs once the request is written, before the wait for the answer (see
// uconn.flushAndWait), so the requests of a burst see where the first ones went.
func (c *call) routed() {
	ti := c.routedTarget
	c.route.recorder.Routed(&c.pick, ti)
	c.recorded = true
	if p := &c.pick; p.cpsDone && len(p.cps) > 0 {
		p.peers.Routed(c.route.Targets[ti].peerID, p.cps)
	}
}

// writeRequest writes the upstream request and waits until its answer can be read (uconn.flushAndWait). The
// body is the client's, with the value of "model" replaced by t.Model (as a JSON string) unless it already
// is that, the rest byte for byte. Client headers are passed on except hop-by-hop ones (those named in
// Connection too) and those the provider sets itself: its configured headers and, when api_key_env is set,
// Authorization. X-Forwarded-For gets the client's address appended.
func (c *call) writeRequest(ctx *fasthttp.RequestCtx, conn *uconn, t *Target) error {
	p := t.Provider
	_ = conn.wd.SetAfter(c.sent, p.up.headersWait, conn.nc.SetWriteDeadline)
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
	// The hop list goes on with this gateway's id (loop.go), first, so that it is the X-Rolter-Hop the next
	// gateway reads; the client's is skipped below with the other x-rolter-* headers.
	bw.WriteString("\r\n" + hopHeader + ": ")
	if len(c.hdr.hop) > 0 {
		bw.Write(c.hdr.hop)
		bw.WriteString(", ")
	}
	bw.WriteString(c.g.hopID)
	bw.WriteString("\r\n")
	hasCT := false
	var xff []byte
	connTokens := c.hdr.connection
	for k, v := range ctx.Request.Header.All() {
		if skipRequestHeader(k) || ((p.auth != nil || c.stripAuth) && equalFold(k, "authorization")) || p.setsHeader(k) ||
			(len(connTokens) > 0 && listsToken(connTokens, k)) {
			continue
		}
		if equalFold(k, "x-forwarded-for") {
			xff = v
			continue
		}
		if c.traced && equalFold(k, "traceparent") {
			continue // replaced by the gateway's span below
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
	if !p.setsXFF {
		bw.WriteString("X-Forwarded-For: ")
		if len(xff) > 0 {
			bw.Write(xff)
			bw.WriteString(", ")
		}
		c.scratch = appendClientIP(c.scratch[:0], ctx)
		bw.Write(c.scratch)
		bw.WriteString("\r\n")
	}
	if c.traced {
		bw.WriteString("Traceparent: ")
		c.scratch = c.appendTraceparent(c.scratch[:0])
		bw.Write(c.scratch)
		bw.WriteString("\r\n")
	}
	bw.WriteString("X-Request-Id: ")
	bw.Write(c.reqID)
	body := c.reqBody
	ms, me := c.modelAt[0], c.modelAt[1]
	size := len(body)
	splice := !bytes.Equal(body[ms:me], t.modelJSON)
	if splice {
		size += len(t.modelJSON) - (me - ms)
	}
	bw.WriteString("\r\nContent-Length: ")
	c.scratch = strconv.AppendInt(c.scratch[:0], int64(size), 10)
	bw.Write(c.scratch)
	bw.WriteString("\r\n\r\n")
	if splice {
		bw.Write(body[:ms])
		bw.Write(t.modelJSON)
		bw.Write(body[me:])
	} else {
		bw.Write(body)
	}
	return conn.flushAndWait()
}

// appendClientIP appends the client's IP address (no port) to dst.
func appendClientIP(dst []byte, ctx *fasthttp.RequestCtx) []byte {
	switch a := ctx.RemoteAddr().(type) {
	case *net.TCPAddr:
		if ip4 := a.IP.To4(); ip4 != nil {
			for i, b := range ip4 {
				if i > 0 {
					dst = append(dst, '.')
				}
				dst = strconv.AppendUint(dst, uint64(b), 10)
			}
			return dst
		}
		return append(dst, a.IP.String()...)
	}
	return append(dst, "unknown"...)
}

// listsToken reports whether the comma-separated header value list names token (case-insensitively).
func listsToken(list, token []byte) bool {
	for len(list) > 0 {
		i := bytes.IndexByte(list, ',')
		item := list
		if i >= 0 {
			item, list = list[:i], list[i+1:]
		} else {
			list = nil
		}
		item = bytes.TrimSpace(item)
		if len(item) == len(token) && bytes.EqualFold(item, token) {
			return true
		}
	}
	return false
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
	e := normaliseUpstreamError(c.status, c.errBuf)
	if c.status >= 500 {
		c.g.log.Debug("upstream error answer", "request_id", string(c.reqID), "target", t.Provider.Name,
			"status", c.status, "body", sanitiseText(c.errBuf))
	}
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

// setDecisionHeaders adds the x-rolter-* headers (docs/routing/README.md, "Decision headers").
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

// Read is the body stream the server copies to the client. Each upstream read is returned as is, so the
// server writes and flushes it as one chunk: SSE events reach the client as the engine produces them.
// A stream that fails after its first byte ends with an SSE error event and no [DONE], on which the OpenAI
// SDKs raise (openai-python src/openai/_streaming.py); a non-SSE body that fails ends with an error, so the
// server closes the connection and the client sees a truncated response rather than a clean one.
func (c *call) Read(p []byte) (int, error) {
	if c.respOff < len(c.respBuf) {
		n := copy(p, c.respBuf[c.respOff:])
		if c.respOff == 0 {
			c.firstByte()
		}
		c.respOff += n
		c.bytesOut += int64(n)
		c.keepTail(p[:n])
		c.usage.feed(p[:n])
		return n, nil
	}
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
			c.firstByte()
		}
		c.bytesOut += int64(n)
		c.keepTail(p[:n])
		c.usage.feed(p[:n])
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

// firstByte notes the response's first byte to the client.
func (c *call) firstByte() {
	c.gotFirst = true
	c.target.m.TTFB.UpdateDuration(c.sent)
	if c.obs != nil {
		c.firstAt = time.Now()
	}
}

// endOfStream ends a body the upstream finished cleanly.
func (c *call) endOfStream() (int, error) {
	if c.sse && !c.sawDone() {
		// The upstream ended the body but the SSE stream never finished: a truncated stream must not look
		// like a successful one (Portkey-AI/gateway#1797 ended such streams with a clean 200).
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
	c.releaseConn(c.upstreamDone && c.streamFail == failNone && err == nil && !gone)
	p := c.target.Provider
	p.adm.release(p.inflight)
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
	c.finish(status)
	return nil
}

var _ fasthttp.ReadCloserWithError = (*call)(nil)
