package engine

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// post handles the proxied POST endpoints: parse once, route, rank, forward.
func (g *Gateway) post(ctx *fasthttp.RequestCtx, ep endpoint) {
	if !ctx.IsPost() {
		ctx.Response.Header.Set("Allow", "POST")
		g.reject(ctx, &apiError{status: fasthttp.StatusMethodNotAllowed, typ: typeInvalidRequest, code: "method_not_allowed",
			message: "this method is not allowed on " + endpointPaths[ep] + "; use POST", noRetry: true})
		return
	}
	snap := g.acquireSnapshot()
	n := g.inflight.Add(1)
	c := g.acquireCall(snap)
	if max := int64(snap.cfg.Queue.MaxInflight); max > 0 && n > max {
		g.rejectBusy(ctx, snap)
		c.release()
		return
	}
	c.start = time.Now()
	c.ep = ep
	c.reqID = requestID(ctx, c.reqID[:0])
	e := c.readBody(ctx)
	if e == nil {
		e = c.prepare(ctx)
	}
	if e != nil {
		if c.route != nil {
			c.setDecisionHeaders(ctx)
			c.status = e.status
			writeError(ctx, e)
			c.finishUnstreamed(ctx)
			return
		}
		ctx.Response.Header.SetBytesV("X-Request-Id", c.reqID)
		g.reject(ctx, e)
		c.release()
		return
	}
	c.run(ctx)
}

// readBody reads the request body into c.reqBody. The buffer grows as the bytes arrive - never to the
// announced Content-Length up front, so a client that announces a large body and sends little holds little -
// and every growth is taken from the gateway's body memory ([server] max_body_memory_bytes); when that is
// spent the request is answered 503 at once.
func (c *call) readBody(ctx *fasthttp.RequestCtx) *apiError {
	limit := c.snap.cfg.Server.MaxBodyBytes
	cl := ctx.Request.Header.ContentLength() // -1: chunked
	if cl > limit {
		ctx.SetConnectionClose()
		return tooLarge(limit)
	}
	buf := c.reqBody[:0]
	if !c.hold(cap(buf)) {
		return c.bodyMemoryFull(ctx)
	}
	r := ctx.RequestBodyStream()
	if r == nil {
		// The server read the body itself (no streaming): it is in memory already.
		body := ctx.Request.Body()
		if len(body) > limit {
			return tooLarge(limit)
		}
		if !c.hold(max(0, len(body)-cap(buf))) {
			return c.bodyMemoryFull(ctx)
		}
		c.reqBody = append(buf, body...)
		return nil
	}
	for cl < 0 || len(buf) < cl {
		if len(buf) == cap(buf) {
			n := max(2*cap(buf), 16<<10)
			if cl >= 0 {
				n = min(n, cl)
			}
			n = min(n, limit+1) // one byte over the limit tells an over-long chunked body
			if !c.hold(n - cap(buf)) {
				c.reqBody = buf
				return c.bodyMemoryFull(ctx)
			}
			nb := make([]byte, len(buf), n)
			copy(nb, buf)
			buf = nb
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if len(buf) > limit {
			c.reqBody = buf
			ctx.SetConnectionClose()
			return tooLarge(limit)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			c.reqBody = buf
			ctx.SetConnectionClose()
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return &apiError{status: fasthttp.StatusRequestTimeout, typ: typeInvalidRequest, code: "request_timeout",
					message: "timed out reading the request body"}
			}
			return badRequest("bad_body", "", "cannot read the request body")
		}
	}
	c.reqBody = buf
	return nil
}

// hold counts n more bytes of this request in the gateway's body memory. It reports false, counting
// nothing, when that would go over [server] max_body_memory_bytes.
func (c *call) hold(n int) bool {
	if n <= 0 {
		return true
	}
	if c.g.bodyMem.Add(int64(n)) > int64(c.snap.cfg.Server.MaxBodyMemoryBytes) {
		c.g.bodyMem.Add(-int64(n))
		return false
	}
	c.held += int64(n)
	return true
}

func (c *call) bodyMemoryFull(ctx *fasthttp.RequestCtx) *apiError {
	ctx.SetConnectionClose()
	c.g.global.Admission("body_memory")
	return &apiError{status: fasthttp.StatusServiceUnavailable, typ: typeServer, code: "server_busy",
		message: "the gateway holds server.max_body_memory_bytes of requests; retry later", retryAfterMs: 1000}
}

func tooLarge(limit int) *apiError {
	return &apiError{status: fasthttp.StatusRequestEntityTooLarge, typ: typeInvalidRequest, code: "request_too_large",
		message: "request body exceeds server.max_body_bytes (" + strconv.Itoa(limit) + ")", noRetry: true}
}

// checkRequest refuses what the HTTP parser let through but the gateway must not forward or serve: a
// protocol version other than HTTP/1.0 and 1.1, header names that are not RFC 9110 tokens (a name with a
// space would reach the engine as some other header), and expectations other than 100-continue.
func checkRequest(ctx *fasthttp.RequestCtx) *apiError {
	h := &ctx.Request.Header
	if p := h.Protocol(); string(p) != "HTTP/1.1" && string(p) != "HTTP/1.0" {
		ctx.SetConnectionClose()
		return &apiError{status: fasthttp.StatusHTTPVersionNotSupported, typ: typeInvalidRequest, code: "http_version_not_supported",
			message: "only HTTP/1.0 and HTTP/1.1 are served", noRetry: true}
	}
	for k := range h.All() {
		if !isToken(k) {
			ctx.SetConnectionClose()
			return badRequest("invalid_header", "", "a request header name is not a valid token")
		}
	}
	if e := h.Peek("Expect"); len(e) > 0 && !equalFold(e, "100-continue") {
		ctx.SetConnectionClose()
		return &apiError{status: fasthttp.StatusExpectationFailed, typ: typeInvalidRequest, code: "expectation_failed",
			message: "the only expectation served is 100-continue", noRetry: true}
	}
	return nil
}

// tokenChars marks the bytes allowed in an HTTP token (RFC 9110 section 5.6.2).
var tokenChars = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !tokenChars[c] {
			return false
		}
	}
	return true
}

// prepare parses the body, finds the route and ranks its targets. It returns the error to answer, if any.
func (c *call) prepare(ctx *fasthttp.RequestCtx) *apiError {
	if e := checkContentType(ctx); e != nil {
		return e
	}
	// The prompt key is at most the body's size; what it holds counts in the body memory like the body.
	keyCap := cap(c.key)
	if !c.hold(keyCap) {
		return c.bodyMemoryFull(ctx)
	}
	var info requestInfo
	e := c.scanner.scan(c.reqBody, c.ep, c.key[:0], &info)
	c.key = info.key
	if !c.hold(cap(c.key) - keyCap) {
		return c.bodyMemoryFull(ctx)
	}
	if e != nil {
		return e
	}
	r := c.snap.route(info.model)
	if r == nil {
		return modelNotFound(info.model)
	}
	c.modelAt[0], c.modelAt[1] = info.modelStart, info.modelEnd
	c.route = r

	p := &c.pick
	p.Route = r
	p.Key = c.key
	p.SessionID = ctx.Request.Header.Peek("X-Session-Id")
	p.Now = c.start.UnixNano()
	p.kvScratch = &c.kvScratch
	p.kvOut = c.kvOut[:]
	p.tmp = c.tmp[:0]
	if h := ctx.Request.Header.Peek("X-Rolter-Vllm-Token-Ids"); len(h) > 0 {
		var ok bool
		if c.tokens, ok = parseTokenIDs(c.tokens[:0], h); ok {
			p.TokenIDs, p.TokenIDsState = c.tokens, tokenIDsOK
		} else {
			p.TokenIDsState = tokenIDsMalformed
		}
	}
	if c.eligibleTargets() {
		c.nOrder, c.decision = r.Strategy.Rank(p, c.order[:])
	} else if e := c.failOpen(); e != nil {
		return e
	}
	r.m.DecisionMade(int(c.decision.Reason))
	r.m.Decision.UpdateDuration(c.start)
	return nil
}

// eligibleTargets fills c.pick.Eligible with the targets that can take a request (healthy, not cooling
// down, circuit not open) and reports whether there is any.
func (c *call) eligibleTargets() bool {
	p := &c.pick
	p.Eligible = c.eligible[:0]
	p.EligibleMask = 0
	for i, t := range c.route.Targets {
		if t.Provider.health.eligible(p.Now) {
			p.Eligible = append(p.Eligible, i)
			p.EligibleMask |= 1 << i
		}
	}
	return len(p.Eligible) > 0
}

// failOpen handles a route with no eligible target: by default the request goes to the least-bad target
// (a fleet-wide outage of the gateway's own making - every replica cooling at once - is worse than trying),
// or, with health.fail_open = false, it is answered 503.
func (c *call) failOpen() *apiError {
	r := c.route
	if !c.snap.cfg.Health.FailOpen {
		r.m.Rejected.Inc()
		return &apiError{status: fasthttp.StatusServiceUnavailable, typ: typeServer, code: "no_available_target",
			message: "no target of model " + r.Model + " is available (unhealthy, cooling down or circuit open)", retryAfterMs: 1000}
	}
	r.m.FailOpen.Inc()
	c.failingOpen = true
	p := &c.pick
	n := len(r.Targets)
	for i := range n {
		c.order[i] = i
		p.Eligible = append(p.Eligible, i)
		p.EligibleMask |= 1 << i
	}
	// Insertion sort by badness: n <= maxTargets and this is the rare path.
	for i := 1; i < n; i++ {
		for j := i; j > 0 && r.Targets[c.order[j]].Provider.health.badness(p.Now) < r.Targets[c.order[j-1]].Provider.health.badness(p.Now); j-- {
			c.order[j], c.order[j-1] = c.order[j-1], c.order[j]
		}
	}
	c.nOrder = n
	c.decision = decide(ReasonFallback)
	return nil
}

// rejectBusy answers a request over [queue] max_inflight.
func (g *Gateway) rejectBusy(ctx *fasthttp.RequestCtx, snap *Snapshot) {
	ms := int(snap.cfg.Queue.RetryAfterSecs * 1000)
	g.global.Admission("global")
	writeError(ctx, &apiError{status: fasthttp.StatusTooManyRequests, typ: typeRateLimit, code: "too_many_requests",
		message: "the gateway is at queue.max_inflight; retry later", retryAfterMs: ms})
	var id [16]byte
	ctx.Response.Header.SetBytesV("X-Request-Id", requestID(ctx, id[:0]))
}

// checkContentType accepts JSON bodies (application/json, application/*+json, or no Content-Type, which
// curl-like clients omit) without a content encoding.
func checkContentType(ctx *fasthttp.RequestCtx) *apiError {
	if enc := ctx.Request.Header.ContentEncoding(); len(enc) > 0 && !equalFold(enc, "identity") {
		return &apiError{status: fasthttp.StatusUnsupportedMediaType, typ: typeInvalidRequest, code: "unsupported_media_type",
			message: "request bodies with a Content-Encoding are not supported", noRetry: true}
	}
	ct := ctx.Request.Header.ContentType()
	if len(ct) == 0 {
		return nil
	}
	if i := bytes.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = bytes.TrimSpace(ct)
	if equalFold(ct, "application/json") || (hasPrefixFold(ct, "application/") && len(ct) > 5 && equalFold(ct[len(ct)-5:], "+json")) {
		return nil
	}
	return &apiError{status: fasthttp.StatusUnsupportedMediaType, typ: typeInvalidRequest, code: "unsupported_media_type",
		message: "this Content-Type is not supported; send application/json", noRetry: true}
}
