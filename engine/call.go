package engine

import (
	"errors"
	"github.com/rolter-ai/rolter/limits"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/accesslog"
	"github.com/rolter-ai/rolter/clientconn"
	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/disagg"
	"github.com/rolter-ai/rolter/kvindex"
	"github.com/rolter-ai/rolter/promptkey"
	"github.com/rolter-ai/rolter/tracing"
)

// call is one request the gateway refuses or proxies, and this file is its life, top to bottom:
//
//	post          begins the call (begin: the live snapshot, a pooled call, the request's id and records)
//	admitGlobal   counts it under [queue] max_inflight
//	readBody      reads the body as it arrives, within the body memory
//	prepare       scans the JSON, finds the route, ranks the eligible targets
//	run           admits, attempts (proxy.go) and retries until one target answers
//	finish        records the outcome and releases the call - the one place a request ends
//
// A request refused before post (Gateway.refuse) begins a call too, and ends it in finish; every error
// answer is written by writeError (errors.go).
//
// A call is pooled: acquired when a request arrives and released when its response is finished - after the
// handler returns for a streamed body, since it is the body stream the server reads (Read and
// CloseWithError in proxy.go; docs/internals/fasthttp.md).
type call struct {
	g       *Gateway
	snap    *Snapshot
	route   *Route
	target  *Target
	ep      promptkey.Endpoint
	scanner promptkey.Scanner
	// logPath and method name the request in its records, spanName its span ("" for requests refused
	// before post): constants, never request bytes (loggedPath, methodName).
	logPath, method, spanName string

	reqBody  []byte // the client's request body, read by readBody
	held     int64  // bytes of reqBody and key counted in the gateway's body memory
	key      []byte // prompt key
	modelAt  [2]int // span of the model value in reqBody, replaced by each target's model when it differs
	path     []byte // upstream request path
	reqID    []byte
	hdr      reqHeaders // the request headers read, which stay valid until the request ends
	pick     Pick
	eligible [maxTargets]int
	order    [maxTargets]int
	nOrder   int
	tried    uint64
	// spill are the eligible targets an adapter route's home set left out (lora.go): candidates only once
	// the set's are tried.
	spill    uint64
	decision Decision
	retries  int
	// lim is what the request holds of its key's and org's limits, limited whether it holds anything to
	// settle, limPrompt its prompt's estimated tokens, events the stream events the client got (limits.go).
	lim       limits.Reservation
	limited   bool
	limPrompt int64
	events    int64
	// tenant is the request's data-plane key, nil without one; tenantModel the route's model; limitRefused
	// says a limit refused it (tenant_usage.go).
	tenant       *dataKey
	tenantModel  string
	limitRefused bool
	// failingOpen: no target was eligible; the ranking is every target, least bad first.
	failingOpen bool
	// picked is the provider of the ranking's first target until the request is admitted anywhere: its
	// load counts the request meanwhile (pickTarget).
	picked *Provider
	// probe: the current attempt is a half-open breaker probe.
	probe bool
	// recorded: the strategy has been told where the request went.
	recorded bool

	start time.Time
	sent  time.Time
	// counted: the request is in the gateway's requests in flight (admitGlobal); overCap: it was refused
	// for being over [queue] max_inflight.
	counted, overCap bool
	// errCode is the code of the error answered (writeError), "" when none was.
	errCode string

	// The upstream response being streamed. respBuf holds what was read of it before the response started
	// (a non-streaming body is read whole, up to maxPrefetch); respOff is how much of it was sent.
	conn         *uconn
	bodyStream   io.Reader
	respBuf      []byte
	respOff      int
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
	// scratch formats numbers and addresses for the upstream request (a stack array would escape through
	// the bufio.Writer's io.Writer).
	scratch []byte
	// authBuf is the input of the data-plane key hash; stripAuth keeps the client's key from the upstream.
	authBuf   []byte
	stripAuth bool

	// matches is the strategy's predicted reuse per target (Pick.Matches); usage follows the response body
	// for the engine's own account of it (usage.go).
	matches [maxTargets]int32
	cps     [maxPeerCheckpoints]uint64
	peerM   [maxTargets]int32
	usage   usageScan
	// shadow is the request's slot with the route's shadow strategies (shadow.go), nil when it has none.
	shadow *shadowSlot

	// The request's records (observe.go): the observers it started with, the client's address, its trace
	// context, when the upstream's headers and the first byte came, the last failed attempt's kind.
	obs         *observers
	client      netip.AddrPort
	trace       tracing.TraceContext
	traced      bool
	traceParent [8]byte
	headersAt   time.Time
	firstAt     time.Time
	lastFail    failKind
	logRec      accesslog.Record
	span        tracing.Span

	tokens    []uint32 // x-rolter-vllm-token-ids
	kvScratch kvindex.Scratch
	kvOut     [kvindex.MaxTargets]int
	tmp       [maxTargets]int
	// routedHook is routed as a func value, made once per pooled call; routedTarget is its argument.
	routedHook   func()
	routedTarget int

	// A request of a disaggregated route (disagg_call.go): the hop being sent, the body's object (where
	// the hop's suffix goes), the suffix, the prefill target whose params the decode gets and those params,
	// the prefill's usage, the decode targets tried, whether the last decode attempt reached its engine, and
	// why the prefill was skipped.
	hop         hop
	obj         disagg.Object
	suffix      []byte
	prefillT    *Target
	kvParams    []byte
	pdUsage     usageFigures
	decodeTried uint64
	reached     bool
	skip        int
	// writeOnly: the hop's request is written without waiting for its answer (disagg_pair.go).
	writeOnly bool
}

var callPool sync.Pool

// post handles the proxied POST endpoints: parse once, route, rank, forward.
func (g *Gateway) post(ctx *fasthttp.RequestCtx, ep promptkey.Endpoint, hs *reqHeaders) {
	c := g.begin(ctx, hs, ep.Path())
	c.ep, c.spanName = ep, spanNames[ep]
	if !ctx.IsPost() {
		ctx.Response.Header.Set("Allow", "POST")
		c.answerError(ctx, &apiError{status: fasthttp.StatusMethodNotAllowed, typ: typeInvalidRequest, code: "method_not_allowed",
			message: "this method is not allowed on " + ep.Path() + "; use POST", noRetry: true})
		return
	}
	if !c.admitGlobal() {
		c.answerError(ctx, globalBusy(c.snap))
		return
	}
	e := c.readBody(ctx)
	if e == nil {
		e = c.prepare(ctx)
	}
	if e != nil {
		c.answerError(ctx, e)
		return
	}
	if c.route.pd != nil {
		c.runPD(ctx)
		return
	}
	c.run(ctx)
}

// begin starts the call of a request the gateway refuses or proxies - every request but the GET
// endpoints it answers itself: it takes the live snapshot and a pooled call, and notes when the request
// came, the headers checkRequest read, the request's id and its records (observe). path is the constant the
// records name the request's path by (loggedPath). The call ends with finish.
func (g *Gateway) begin(ctx *fasthttp.RequestCtx, hs *reqHeaders, path string) *call {
	c := g.acquireCall(g.acquireSnapshot())
	c.start = time.Now()
	c.hdr = *hs
	c.logPath, c.method = path, methodName(ctx)
	c.reqID = requestID(hs.requestID, c.reqID[:0])
	c.observe(ctx)
	return c
}

// acquireCall returns a pooled call for a request on snap, which the caller took with acquireSnapshot;
// release gives both back.
func (g *Gateway) acquireCall(snap *Snapshot) *call {
	c, _ := callPool.Get().(*call)
	if c == nil {
		c = &call{tail: make([]byte, 0, 32)}
		c.routedHook = c.routed
	}
	c.g = g
	c.snap = snap
	return c
}

// admitGlobal counts the request in the gateway's requests in flight (release uncounts it) and reports
// whether it is within [queue] max_inflight.
func (c *call) admitGlobal() bool {
	n := c.g.inflight.Add(1)
	c.counted = true
	if max := int64(c.snap.cfg.Queue.MaxInflight); max > 0 && n > max {
		c.g.global.Admission("global")
		c.overCap = true
		return false
	}
	return true
}

// globalBusy is the answer to a request over [queue] max_inflight.
func globalBusy(snap *Snapshot) *apiError {
	return &apiError{status: fasthttp.StatusTooManyRequests, typ: typeRateLimit, code: "too_many_requests",
		message: "the gateway is at queue.max_inflight; retry later", retryAfterMs: int(snap.cfg.Queue.RetryAfterSecs * 1000)}
}

// answerError answers e and ends the request.
func (c *call) answerError(ctx *fasthttp.RequestCtx, e *apiError) {
	c.writeError(ctx, e)
	c.finish(c.status)
}

// readBody reads the request body into c.reqBody. The buffer grows as the bytes arrive - never to the
// announced Content-Length up front, so a client that announces a large body and sends little holds little -
// and every growth is taken from the gateway's body memory ([server] max_body_memory_bytes); when that is
// spent the request is answered 503 at once.
func (c *call) readBody(ctx *fasthttp.RequestCtx) *apiError {
	limit := c.snap.cfg.Server.MaxBodyBytes
	cl := ctx.Request.Header.ContentLength() // -1: chunked
	if cl > limit {
		clientconn.CloseAfter(ctx)
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
			clientconn.CloseAfter(ctx)
			return tooLarge(limit)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			c.reqBody = buf
			clientconn.CloseAfter(ctx)
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
	clientconn.CloseAfter(ctx)
	c.g.global.Admission("body_memory")
	return &apiError{status: fasthttp.StatusServiceUnavailable, typ: typeServer, code: "server_busy",
		message: "the gateway holds server.max_body_memory_bytes of requests; retry later", retryAfterMs: 1000}
}

func tooLarge(limit int) *apiError {
	return &apiError{status: fasthttp.StatusRequestEntityTooLarge, typ: typeInvalidRequest, code: "request_too_large",
		message: "request body exceeds server.max_body_bytes (" + strconv.Itoa(limit) + ")", noRetry: true}
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
	var info promptkey.Info
	c.scanner.KeyFields = c.snap.cfg.Server.CacheKeyFields
	e := c.scanner.Scan(c.reqBody, c.ep, c.key[:0], &info)
	c.key = info.Key
	if !c.hold(cap(c.key) - keyCap) {
		return c.bodyMemoryFull(ctx)
	}
	if e != nil {
		return scanError(e)
	}
	r := c.snap.route(info.Model)
	if r == nil {
		return modelNotFound(info.Model)
	}
	if r.keyed {
		// The route's org has data-plane keys: the request needs one of them. Another org's key finds no
		// such model (404, as for one that does not exist); the key itself never goes upstream.
		k, scratch := c.snap.key(c.hdr.authorization, c.authBuf)
		c.authBuf = scratch
		if k == nil {
			return invalidKey()
		}
		if k.org != r.org {
			return modelNotFound(info.Model)
		}
		c.stripAuth = true
		if e := c.limit(k, r, info.Model, info.MaxTokens); e != nil {
			return e
		}
	} else if len(c.hdr.authorization) > 0 && len(c.snap.keys) > 0 {
		// A public route passes the client's Authorization to an engine without api_key_env (it may be
		// the engine's own key), but a data-plane key is the gateway's secret: it never goes upstream. The
		// key's limits hold on every route.
		var k *dataKey
		k, c.authBuf = c.snap.key(c.hdr.authorization, c.authBuf)
		c.stripAuth = k != nil
		if k != nil {
			if e := c.limit(k, r, info.Model, info.MaxTokens); e != nil {
				return e
			}
		}
	}
	if len(r.Targets) == 0 {
		return noEndpoints(r)
	}
	c.modelAt[0], c.modelAt[1] = info.ModelStart, info.ModelEnd
	if r.pd != nil {
		// Where a hop's members go, from the scan's one pass (disagg_call.go).
		c.obj = disagg.NewObject(info.End, info.Members, disagg.Keys(info.Overrides))
	}
	c.route = r

	p := &c.pick
	p.Route = r
	p.Key, p.Opening = c.key, info.Opening
	p.SessionID = sessionID(&ctx.Request.Header, c.hdr.sessionID, info.Session, c.snap.cfg.Server.SessionHeaders)
	p.Now = c.start.UnixNano()
	p.kvScratch = &c.kvScratch
	p.kvOut = c.kvOut[:]
	p.tmp = c.tmp[:0]
	p.Matches = c.matches[:len(r.Targets)]
	p.peers, p.cps, p.cpsDone, p.peerM = nil, nil, false, nil
	if b := c.g.peers.Load(); b != nil {
		p.peers, p.cps, p.peerM = b.p, c.cps[:0], c.peerM[:len(r.Targets)]
	}
	if h := c.hdr.tokenIDs; len(h) > 0 {
		var ok bool
		if c.tokens, ok = parseTokenIDs(c.tokens[:0], h); ok {
			p.TokenIDs, p.TokenIDsState = c.tokens, tokenIDsOK
		} else {
			p.TokenIDsState = tokenIDsMalformed
		}
	}
	if c.eligibleTargets() {
		if r.lora != nil {
			c.spill = r.lora.restrict(p)
		}
		c.nOrder, c.decision = r.rank(p, c.order[:])
		c.pickTarget(r.Targets[c.order[0]].Provider)
	} else if e := c.failOpen(); e != nil {
		return e
	}
	r.m.DecisionMade(int(c.decision.Reason))
	r.m.Decision.UpdateDuration(c.start)
	if r.shadows != nil {
		c.shadow = r.shadows.enqueue(p)
	}
	return nil
}

// pickTarget counts the request in p's load as picked, not yet admitted (nil: in nobody's), and uncounts it
// from the provider it counted in before: between the ranking and the admission, the next request's ranking
// already sees it.
func (c *call) pickTarget(p *Provider) {
	if c.picked != nil {
		c.picked.picked.Add(-1)
	}
	if c.picked = p; p != nil {
		p.picked.Add(1)
	}
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

// noEndpoints answers a request for route r while its discovery sources have found no engine.
func noEndpoints(r *Route) *apiError {
	r.m.Rejected.Inc()
	return &apiError{status: fasthttp.StatusServiceUnavailable, typ: typeServer, code: "no_available_target",
		message: "model " + r.Model + " has no engine yet: its discovery sources have found none ready", retryAfterMs: 1000}
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

func (c *call) release() {
	c.pickTarget(nil)
	c.watch.disarm()
	c.endShadow(-1, false)
	c.resetObserve()
	if c.counted {
		c.g.inflight.Add(-1)
		c.counted, c.overCap = false, false
	}
	c.snap.releaseUser()
	if c.held > 0 {
		c.g.bodyMem.Add(-c.held)
		c.held = 0
	}
	c.g, c.snap, c.route, c.target = nil, nil, nil, nil
	c.ep, c.logPath, c.method, c.spanName, c.errCode = 0, "", "", "", ""
	c.failingOpen, c.probe, c.recorded, c.stripAuth = false, false, false, false
	c.hop, c.obj, c.suffix, c.prefillT, c.kvParams = hopWhole, disagg.Object{}, c.suffix[:0], nil, c.kvParams[:0]
	c.pdUsage, c.decodeTried, c.reached, c.skip, c.writeOnly = usageFigures{}, 0, false, skipNone, false
	c.pick = Pick{}
	c.hdr = reqHeaders{}
	c.tried, c.nOrder, c.retries, c.spill = 0, 0, 0, 0
	c.lim.Reset()
	c.limited, c.limPrompt, c.events = false, 0, 0
	c.tenant, c.tenantModel, c.limitRefused = nil, "", false
	c.conn, c.bodyStream = nil, nil
	c.status, c.sse, c.gotFirst, c.upstreamDone = 0, false, false, false
	c.streamFail, c.pendingErr, c.pending = failNone, nil, nil
	c.tail = c.tail[:0]
	c.usage.reset()
	c.bytesOut, c.closed = 0, false
	c.respBuf, c.respOff = c.respBuf[:0], 0
	// Pooled calls keep their buffers for the next request, but never large ones: a pool of calls that once
	// served huge requests would pin that memory for good.
	if cap(c.reqBody) > maxPooledBuf {
		c.reqBody = nil
	}
	if cap(c.key) > maxPooledBuf {
		c.key = nil
	}
	c.scanner.Shrink(maxPooledBuf)
	if cap(c.respBuf) > maxPooledBuf {
		c.respBuf = nil
	}
	if cap(c.kvParams) > maxPooledBuf {
		c.kvParams = nil
	}
	if cap(c.tokens) > 1<<18 {
		c.tokens = nil
	}
	if cap(c.errBuf) > 64<<10 {
		c.errBuf = nil
	}
	callPool.Put(c)
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
// 5xx/429 answers on the next candidate - only before any byte reached the client (a retry after it would
// duplicate output), never after the client left (nobody would read the answer). A candidate that became
// ineligible meanwhile (just marked down, cooling, circuit open) is skipped, as is one whose concurrency cap
// and wait queue are full.
func (c *call) run(ctx *fasthttp.RequestCtx) {
	cfg := &c.snap.cfg.Retry
	var last attemptResult
	sent := 0
	c.watch.arm(ctx.Conn(), c.g.watchDelay, nil, ctx.Request.Header.IsHTTP11())
	ti, k := -1, 0
	for sent <= cfg.MaxRetries {
		if last.kind != failStale {
			// A stale pooled connection is retried on the same target; anything else moves on.
			if ti = c.nextTarget(k); ti < 0 {
				break
			}
			k++
		}
		t := c.route.Targets[ti]
		if ok, left, busy := c.admitOrBusy(ctx, t); !ok {
			if left {
				c.finish(c.status)
				return
			}
			last = busy
			continue
		}
		if lr := c.route.lora; lr != nil && lr.dynamic {
			if err := lr.ensure(t, ti); err != nil {
				// The replica cannot take the adapter; the next candidate may. The replica serves its other models
				// as before: no cooldown, no breaker failure.
				c.done(t, failClient, 0)
				last = attemptResult{kind: failConnect, err: &apiError{status: fasthttp.StatusBadGateway, typ: typeServer, code: "upstream_error", message: err.Error()}}
				continue
			}
		}
		if sent > 0 {
			c.retried(c.target, last.kind)
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
			c.finish(c.status)
			return
		}
		last = res
	}
	c.answerFailure(ctx, last)
}

// answerFailure answers a request no candidate target served; last is the last failed attempt.
func (c *call) answerFailure(ctx *fasthttp.RequestCtx, last attemptResult) {
	c.watch.disarm()
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
	c.answerError(ctx, e)
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
		c.pickTarget(nil)
		return false
	}
	acquired := p.adm.acquire(p.inflight, c.watch.left())
	c.pickTarget(nil) // after the acquire: counted picked while waiting for a slot, in flight once it has one
	if !acquired {
		if probe {
			p.health.brProbes.Add(-1)
		}
		c.g.global.Admission("target")
		return false
	}
	c.probe = probe
	if lr := c.route.lora; lr != nil {
		lr.sent(t, c.pick.Now)
	}
	return true
}

// admitOrBusy is admit for a candidate of run's loops. When t has no slot, left reports a client that left
// meanwhile, which is answered (clientLeft) and must be finished, and busy is the attempt to answer if no
// other candidate takes the request.
func (c *call) admitOrBusy(ctx *fasthttp.RequestCtx, t *Target) (ok, left bool, busy attemptResult) {
	if c.admit(t) {
		return true, false, attemptResult{}
	}
	if c.watch.gone.Load() {
		c.clientLeft(ctx, nil)
		return false, true, attemptResult{}
	}
	return false, false, attemptResult{kind: failBusy, err: c.busyError(t)}
}

// done releases t's slot and records the attempt's outcome for cooldowns and the breaker.
func (c *call) done(t *Target, kind failKind, retryAfter time.Duration) {
	p := t.Provider
	p.adm.release(p.inflight)
	if lr := c.route.lora; lr != nil {
		lr.done(t.Index)
	}
	c.record(t, kind, retryAfter)
}

// record reports the attempt's outcome to t's cooldown and breaker state.
func (c *call) record(t *Target, kind failKind, retryAfter time.Duration) {
	p := t.Provider
	switch kind {
	case failNone:
		p.health.success(c.probe)
	case failClient, failBusy, failStale:
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

func backoff(cfg *config.RetryConfig, attempt int) time.Duration {
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
	if best < 0 && c.spill != 0 {
		best = c.leastLoadedSpill(now)
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

// leastLoadedSpill returns the least-loaded target of c.spill not tried yet and still eligible, or -1.
func (c *call) leastLoadedSpill(now int64) int {
	best, bestLoad := -1, int64(0)
	for i, t := range c.route.Targets {
		if c.spill&(1<<i) == 0 || c.tried&(1<<i) != 0 || !t.Provider.health.eligible(now) {
			continue
		}
		if l := t.Load(); best < 0 || l < bestLoad {
			best, bestLoad = i, l
		}
	}
	return best
}

// maxPooledBuf is the largest buffer a pooled call keeps.
const maxPooledBuf = 1 << 20

// finish is the one place a request ends, once, whatever its path: refused before routing (refuse), answered
// from the handler after routing (run), or streamed by the server after the handler returned
// (CloseWithError). It records the final status in the metrics (the target's, the route's, or the
// gateway's refusals), the routing evidence (reuse, the routing trace, the shadow strategies), the access-log
// line and the span, and gives the call back.
func (c *call) finish(status int) {
	c.settleLimits(status)
	c.recordUsage(status)
	switch {
	case c.target != nil:
		if status >= 200 && status < 300 {
			switch {
			case c.hop == hopWhole:
				c.accountReuse(c.target, c.usage.figures())
			case c.prefillT != nil:
				// The prefill engine holds the prompt's cache, and its usage says what it reused.
				c.accountReuse(c.prefillT, c.pdUsage)
			}
		}
		c.target.m.Request(status)
		c.target.m.Duration.UpdateDuration(c.start)
		if c.bytesOut > 0 {
			c.target.m.ResponseBytes.Add(int(c.bytesOut))
		}
	case c.route != nil:
		c.route.m.UnroutedRequest(status)
	case !c.overCap: // a request over the cap is counted as refused by admission (admitGlobal)
		c.g.global.BadRequest(c.errCode)
	}
	if w := c.g.capture.Load(); w != nil && c.route != nil {
		w.record(c, status)
	}
	c.recordEnd(status)
	served := -1
	if c.target != nil {
		served = c.target.Index
	}
	c.endShadow(served, status >= 200 && status < 300)
	c.release()
}

// endShadow tells the route's shadow strategies that the request ended, once.
func (c *call) endShadow(served int, ok bool) {
	if c.shadow != nil {
		c.route.shadows.ended(c.shadow, served, ok)
		c.shadow = nil
	}
}

// accountReuse records the routing evidence of a successful request (docs/architecture.md, "Routing
// evidence"): the reuse its engine reported, and beside it, over the same requests, the reuse the strategy
// predicted - the best match over the eligible targets (held) and the chosen target's (captured).
func (c *call) accountReuse(t *Target, u usageFigures) {
	m := t.m
	if !u.found || !u.hasCached {
		// No usage, or usage without cached_tokens (an engine that does not report prompt token details):
		// unmeasured, which is not the same as no reuse.
		m.Unmeasured.Inc()
		return
	}
	m.Measured.Inc()
	m.PromptTokens.Add(int(u.prompt))
	m.CachedTokens.Add(int(u.cached))
	p := &c.pick
	if p.MatchOf <= 0 {
		return
	}
	held, captured := p.predicted(t.Index)
	m.ReuseScored.Add(p.MatchOf)
	m.ReuseHeld.Add(int(held))
	m.ReuseCaptured.Add(int(captured))
	if u.prompt > 0 {
		t.gap.add(float64(captured)/float64(p.MatchOf) - float64(u.cached)/float64(u.prompt))
		c.route.checkStale(t)
	}
}
