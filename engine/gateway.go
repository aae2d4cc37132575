package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/clientconn"
	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/egress"
	"github.com/rolter-ai/rolter/promptkey"
	"github.com/rolter-ai/rolter/telemetry"
)

// Options are the non-config knobs of a Gateway.
type Options struct {
	Logger  *slog.Logger
	Version string
	// Dial, when set, replaces TCP dialing of upstreams (in-memory listeners in tests and benchmarks).
	Dial func(addr string, timeout time.Duration) (net.Conn, error)
	// WatchDelay is how long a request may wait on its upstream before the gateway starts watching the
	// client connection for a disconnect (default 50 ms).
	WatchDelay time.Duration
	// Resolver, when set, replaces DNS for the egress policy's lookups (tests).
	Resolver egress.Resolver
	// Linger is how long a client connection the server closes mid-request waits for each further byte
	// from the client before it is closed (lingering close; default 2 s, and five times that in all).
	Linger time.Duration
	// ParkAfter is how long a keep-alive client connection waits for its next request before fasthttp lets
	// go of it and its buffers (parking; default 1 s).
	ParkAfter time.Duration
}

// Gateway is the data plane: a fasthttp server that routes OpenAI-compatible requests to upstream targets.
type Gateway struct {
	log        *slog.Logger
	version    string
	watchDelay time.Duration
	dial       func(string, time.Duration) (net.Conn, error)
	resolver   egress.Resolver
	hopID      string // this gateway's id in X-Rolter-Hop (loop.go)

	snap     atomic.Pointer[Snapshot]
	capture  atomic.Pointer[captureWriter] // [trace], nil when off (capture.go)
	obs      atomic.Pointer[observers]     // [log] and [tracing] (observe.go)
	peers    atomic.Pointer[peersBox]      // evidence shared with other replicas (peers.go), nil when none
	server   *fasthttp.Server
	draining atomic.Bool
	lnMu     sync.Mutex
	lns      []net.Listener
	global   *telemetry.Global
	usage    *usageBook // what each data-plane key used (tenant_usage.go)
	// limitShare is how many gateways keep the limits together (SetLimitShare); 0 or 1: this one alone.
	limitShare atomic.Int64
	// conns is the socket budget client and upstream connections share (clientconn.Budget, derived from the
	// open-file limit); clients admits client connections under it and [server] max_conns (clientconn.Limiter).
	conns *clientconn.Budget
	// control is the control plane's connection cap, kept out of the socket budget (ControlListener).
	control int
	clients *clientconn.Limiter

	stop chan struct{}
	wg   sync.WaitGroup

	// Reload state (snapshot.go): reloadMu orders builds, publishes and retirements; series are the route and
	// target metric series by label identity; kv is the KV-event state (nil until a config needs it);
	// retiring counts the goroutines waiting for replaced snapshots to drain.
	reloadMu sync.Mutex
	series   map[string]*series
	kv       *kvState
	retiring sync.WaitGroup
	reloads  *telemetry.ReloadMetrics

	_        [64]byte
	inflight atomic.Int64 // requests being proxied, for [queue] max_inflight
	_        [56]byte
	// bodyMem is the memory held by requests in flight: their bodies and prompt keys, and the non-streaming
	// answers read ahead for them ([server] max_body_memory_bytes).
	bodyMem atomic.Int64
	_       [56]byte
}

// New builds a gateway for a validated config (config.Load, config.Parse). Start serving with Serve.
func New(cfg *config.Config, opts Options) (*Gateway, error) {
	g := &Gateway{
		log:        opts.Logger,
		version:    opts.Version,
		watchDelay: opts.WatchDelay,
		dial:       opts.Dial,
		resolver:   opts.Resolver,
		hopID:      newHopID(),
		stop:       make(chan struct{}),
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	if g.watchDelay <= 0 {
		g.watchDelay = defaultWatchDelay
	}
	// The gateway-wide series are this gateway's: exported from the end of New until Shutdown.
	g.global = telemetry.NewGlobal(opts.Version, time.Now(), g.draining.Load)
	g.usage = newUsageBook()

	s := &cfg.Server
	g.control = cfg.Control.ControlConns()
	g.clients = clientconn.NewLimiter(s, g.control, g.log, g.global,
		clientconn.Options{Linger: opts.Linger, ParkAfter: opts.ParkAfter})
	g.conns = g.clients.Budget() // upstream sockets come out of the same budget as client connections
	g.series = map[string]*series{}
	g.reloadMu.Lock()
	capw, err := openCapture(cfg.Trace, nil, g.log)
	if err != nil {
		g.reloadMu.Unlock()
		return nil, err
	}
	obs, err := g.openObservers(cfg, nil)
	if err != nil {
		g.reloadMu.Unlock()
		capw.close()
		return nil, err
	}
	snap, err := g.buildSnapshot(cfg, nil)
	if err != nil {
		g.reloadMu.Unlock()
		if g.kv != nil {
			g.kv.stop()
		}
		capw.close()
		obs.closeNew(nil)
		return nil, err
	}
	snap.gen = 1
	g.publish(snap)
	g.swapCapture(capw)
	g.swapObservers(obs)
	g.reloadMu.Unlock()
	g.reloads = telemetry.NewReloadMetrics(func() uint64 { return g.snap.Load().gen })
	g.reloads.Register()
	g.global.Register()

	g.server = &fasthttp.Server{
		Handler:               g.serve,
		ErrorHandler:          g.serverError,
		Name:                  "rolter",
		NoDefaultServerHeader: true,
		ReadTimeout:           secs(s.ReadTimeoutSecs),
		WriteTimeout:          secs(s.WriteTimeoutSecs),
		IdleTimeout:           secs(s.IdleTimeoutSecs),
		// Bodies are limited by readBody against the live snapshot's max_body_bytes, which a reload may change.
		MaxRequestBodySize: math.MaxInt32,
		ReadBufferSize:     s.MaxHeaderBytes,
		CloseOnShutdown:    true,
		Logger:             fasthttpLogger{g.log},
		// Bodies are read by the handler as they arrive (readBody), never reserved at their announced size.
		StreamRequestBody: true,
		// A connection's first request is waited for holding no buffer (with streamed bodies, later ones are
		// not: connections idle for a while are parked for that, clientconn.Limiter). It also flushes every
		// response before the next request is read, which the client watch relies on (it may write an
		// interim response).
		ReduceMemoryUsage: true,
		// Only JSON bodies are served: never spool a multipart body to temporary files.
		DisablePreParseMultipartForm: true,
		// Parse errors must not carry request bytes (an Authorization header) into logs.
		SecureErrorLogMessage: true,
		ExpectHandler:         g.expect,
		// Tracks fresh, active and idle client connections: idle ones are reclaimed at max_conns.
		ConnState: g.clients.ConnState,
		// The listener admits at most max_conns: fasthttp's own cap (256k by default) must not refuse one
		// of them with its plain-text 503. Twice the cap covers connections still closing.
		Concurrency: max(2*g.clients.Max(), fasthttp.DefaultConcurrency),
	}
	g.clients.SetServe(g.server.ServeConn)
	g.wg.Add(1)
	go g.janitor()
	return g, nil
}

// Snapshot returns the live config snapshot.
func (g *Gateway) Snapshot() *Snapshot { return g.snap.Load() }

// Serve serves requests on ln until Shutdown. It returns nil after a clean shutdown.
func (g *Gateway) Serve(ln net.Listener) error {
	// Accept errors (EMFILE...) are retried rather than ending Serve, and client connections are admitted
	// under [server] max_conns and the socket budget (clientconn.Limiter).
	ln = g.clients.Listener(ln)
	g.lnMu.Lock()
	if g.draining.Load() {
		g.lnMu.Unlock()
		_ = ln.Close()
		return nil
	}
	g.lns = append(g.lns, ln)
	g.lnMu.Unlock()
	g.log.Info("gateway serving", "addr", ln.Addr().String(), "routes", g.snap.Load().describe())
	err := g.server.Serve(ln)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("cannot serve on %s: %w", ln.Addr(), err)
	}
	return nil
}

// Shutdown stops accepting requests, waits for in-flight ones (streams included) until ctx is done, then
// closes what is left and stops background work.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.lnMu.Lock()
	if g.draining.Swap(true) {
		g.lnMu.Unlock()
		return nil
	}
	lns := g.lns
	g.lnMu.Unlock()
	start := time.Now()
	// fasthttp closes only the listeners its Serve loop registered; a Serve that has not got that far yet
	// would otherwise keep serving after Shutdown returned.
	for _, ln := range lns {
		_ = ln.Close()
	}
	// Parked connections are idle ones fasthttp no longer tracks: closed here as it closes the others.
	g.clients.CloseParked()
	err := g.server.ShutdownWithContext(ctx)
	waitGroup(ctx, g.clients.Parkers())
	close(g.stop)
	g.wg.Wait()
	g.retiring.Wait()
	g.reloadMu.Lock()
	snap := g.snap.Load()
	snap.set.Unregister()
	g.release(snap)
	if g.kv != nil {
		g.kv.stop()
	}
	g.swapCapture(nil)
	g.swapObservers(nil)
	g.reloadMu.Unlock()
	g.reloads.Unregister()
	g.global.Unregister() // rolter_draining reads 1 until here
	g.usage.set.Unregister()
	g.log.Info("gateway stopped", "drain", time.Since(start).Round(time.Millisecond).String(), "clean", err == nil || errors.Is(err, net.ErrClosed))
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("cannot shut down the server: %w", err)
	}
	return nil
}

// Reload makes cfg the live config without dropping anything: it validates cfg, builds a snapshot that
// keeps every component whose identity is unchanged (snapshot.go), publishes it with one atomic store, and
// retires the one it replaces once the requests that started on it have finished. On any error nothing
// changes and the error says why (every problem of an invalid config, with file:line when cfg came from a
// file). Settings of the listener itself ([server] listen, max_header_bytes, the read/write/idle timeouts,
// max_conns, max_conns_per_ip), [control] and [cluster] need a restart: a config that changes them is refused.
//
// Reload is safe for concurrent use; reloads are applied one at a time.
func (g *Gateway) Reload(cfg *config.Config) (err error) {
	start := time.Now()
	defer func() {
		g.reloads.Reloaded(err == nil, start)
		if err != nil {
			g.log.Error("config reload refused; the running config keeps serving", "error", err.Error())
		}
	}()
	if errs := config.Validate(cfg); len(errs) > 0 {
		return errs
	}
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	if g.draining.Load() {
		return errors.New("cannot reload: the gateway is shutting down")
	}
	cur := g.snap.Load()
	if err := restartOnly(&cur.cfg.Server, &cfg.Server); err != nil {
		return err
	}
	// The quotas are read by the control plane at every write: they change on reload.
	if !cur.cfg.Control.Equal(&cfg.Control) {
		return errors.New("cannot reload: [control] changed, which needs a restart")
	}
	if cur.cfg.Cluster != cfg.Cluster {
		// The link to the other replicas is made once, at start (cluster.Start).
		return errors.New("cannot reload: [cluster] changed, which needs a restart")
	}
	capw, err := openCapture(cfg.Trace, g.capture.Load(), g.log)
	if err != nil {
		return fmt.Errorf("cannot build the new config: %w", err)
	}
	obs, err := g.openObservers(cfg, g.obs.Load())
	if err != nil {
		if capw != g.capture.Load() {
			capw.close()
		}
		return fmt.Errorf("cannot build the new config: %w", err)
	}
	next, err := g.buildSnapshot(cfg, cur)
	if err != nil {
		if capw != g.capture.Load() {
			capw.close()
		}
		obs.closeNew(g.obs.Load())
		return fmt.Errorf("cannot build the new config: %w", err)
	}
	next.gen = cur.gen + 1
	g.publish(next)
	g.swapCapture(capw)
	g.swapObservers(obs)
	g.log.Info("config reloaded", "generation", next.gen, "routes", next.describe(),
		"took", time.Since(start).Round(time.Microsecond).String())
	return nil
}

// ReloadFile reads the config file at path and reloads it (SIGHUP). A file that does not load is refused
// like any bad config: every problem is logged with file:line, and the running config keeps serving.
func (g *Gateway) ReloadFile(path string) error {
	cfg, err := config.Load(path)
	if err != nil {
		g.RefuseReload(path, err)
		return err
	}
	return g.Reload(cfg)
}

// RefuseReload records a reload refused before it reached Reload - a file that does not load: it is
// counted as failed and every problem is logged (with file:line). The running config keeps serving.
func (g *Gateway) RefuseReload(path string, err error) {
	g.reloads.Reloaded(false, time.Now())
	var errs config.Errors
	if errors.As(err, &errs) {
		for _, e := range errs {
			g.log.Error("config reload refused", "problem", e.Error())
		}
	} else {
		g.log.Error("config reload refused", "problem", err.Error())
	}
	g.log.Error("config reload refused; the running config keeps serving", "file", path)
}

// restartOnly refuses a change to a [server] setting the running listener cannot take.
func restartOnly(cur, next *config.ServerConfig) error {
	var changed []string
	f := func(key string, same bool) {
		if !same {
			changed = append(changed, "server."+key)
		}
	}
	f("listen", cur.Listen == next.Listen)
	f("max_header_bytes", cur.MaxHeaderBytes == next.MaxHeaderBytes)
	f("read_timeout_secs", cur.ReadTimeoutSecs == next.ReadTimeoutSecs)
	f("write_timeout_secs", cur.WriteTimeoutSecs == next.WriteTimeoutSecs)
	f("idle_timeout_secs", cur.IdleTimeoutSecs == next.IdleTimeoutSecs)
	f("max_conns", cur.MaxConns == next.MaxConns)
	f("max_conns_per_ip", cur.MaxConnsPerIP == next.MaxConnsPerIP)
	// The listener's TLS layer is made at start; what the files hold is reloaded (certfile), not their names.
	f("tls_cert_file", cur.TLSCertFile == next.TLSCertFile)
	f("tls_key_file", cur.TLSKeyFile == next.TLSKeyFile)
	f("tls_min_version", cur.TLSMinVersion == next.TLSMinVersion)
	if len(changed) > 0 {
		return fmt.Errorf("cannot reload: %s changed, which needs a restart", strings.Join(changed, ", "))
	}
	return nil
}

// janitor closes upstream connections idle past their keep-alive and watches for silent KV-event streams,
// once a second.
func (g *Gateway) janitor() {
	defer g.wg.Done()
	defer logPanic(g.log, "janitor")
	t := time.NewTicker(min(time.Second, g.clients.ParkAfter()))
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case now := <-t.C:
			g.clients.ParkIdle(now)
			snap := g.snap.Load()
			for _, p := range snap.Providers {
				p.up.closeIdle(false)
			}
			g.watchKVSilence(snap)
		}
	}
}

func logPanic(log *slog.Logger, what string) {
	if r := recover(); r != nil {
		log.Error("BUG: panic in background goroutine", "goroutine", what, "panic", fmt.Sprint(r))
	}
}

// expect answers "Expect: 100-continue" before the body is sent: a body that could not be served is refused
// without being read.
func (g *Gateway) expect(ctx *fasthttp.RequestCtx) int {
	var hs reqHeaders
	e := checkRequest(ctx, &hs)
	if e == nil {
		e = g.checkLoop(hs.hop)
	}
	if max := g.snap.Load().cfg.Server.MaxBodyBytes; e == nil && ctx.Request.Header.ContentLength() > max {
		e = tooLarge(max)
	}
	if e == nil {
		return fasthttp.StatusContinue
	}
	g.refuse(ctx, &hs, e)
	return e.status
}

// serve dispatches by path.
func (g *Gateway) serve(ctx *fasthttp.RequestCtx) {
	var hs reqHeaders
	e := checkRequest(ctx, &hs)
	if e == nil {
		e = g.checkLoop(hs.hop)
	}
	if e != nil {
		g.refuse(ctx, &hs, e)
		return
	}
	path := ctx.Path()
	switch string(path) {
	case "/v1/chat/completions":
		g.post(ctx, promptkey.Chat, &hs)
	case "/v1/completions":
		g.post(ctx, promptkey.Completions, &hs)
	case "/v1/embeddings":
		g.post(ctx, promptkey.Embeddings, &hs)
	case "/v1/responses":
		g.post(ctx, promptkey.Responses, &hs)
	case "/v1/messages":
		g.post(ctx, promptkey.Messages, &hs)
	case "/v1/models":
		if g.onlyGet(ctx, &hs) {
			snap := g.snap.Load()
			body := snap.models
			if org, ok, _ := snap.keyOrg(hs.authorization, nil); ok {
				if b, keyed := snap.orgModels[org]; keyed {
					body = b
				}
			}
			ctx.SetContentType("application/json")
			ctx.SetBody(body)
		}
	case "/healthz":
		if g.onlyGet(ctx, &hs) {
			ctx.SetContentType("text/plain; charset=utf-8")
			ctx.SetBodyString("ok\n")
		}
	case "/readyz":
		if g.onlyGet(ctx, &hs) {
			g.ready(ctx)
		}
	case "/metrics":
		if !g.snap.Load().cfg.Server.ExposeMetrics {
			g.refuse(ctx, &hs, notFound())
			return
		}
		if g.onlyGet(ctx, &hs) {
			ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
			g.WriteMetrics(ctx, "")
		}
	default:
		if len(path) > len("/v1/models/") && string(path[:len("/v1/models/")]) == "/v1/models/" {
			if g.onlyGet(ctx, &hs) {
				g.model(ctx, &hs, path[len("/v1/models/"):])
			}
			return
		}
		if ctx.IsPost() && proxiedPath(path) {
			g.post(ctx, promptkey.Other, &hs)
			return
		}
		g.refuse(ctx, &hs, notFound())
	}
}

func notFound() *apiError {
	return &apiError{status: fasthttp.StatusNotFound, typ: typeInvalidRequest, code: "not_found",
		message: "unknown path", noRetry: true}
}

// ready answers /readyz, what a load balancer or the kubelet asks before it sends this replica requests:
//   - 503 "draining" once SIGTERM started the drain: new requests belong to another replica;
//   - 200 "ready: no routes yet" when the config has no route: the gateway is up and can take its first
//     routes and providers (the control plane's API, or a reload); answering 503 here would keep an
//     empty gateway out of its Service forever, so no one could configure it through that Service;
//   - 503 "no target can take requests" when there are routes but every target of every route is down,
//     cooling or circuit-open: another replica may still reach the fleet;
//   - 200 "ready" otherwise.
func (g *Gateway) ready(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/plain; charset=utf-8")
	if g.draining.Load() {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString("draining\n")
		return
	}
	snap := g.snap.Load()
	if len(snap.Routes) == 0 {
		ctx.SetBodyString("ready: no routes yet\n")
		return
	}
	now := time.Now().UnixNano()
	for _, r := range snap.Routes {
		for _, t := range r.Targets {
			if t.Provider.health.eligible(now) {
				ctx.SetBodyString("ready\n")
				return
			}
		}
	}
	ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	ctx.SetBodyString("no target can take requests\n")
}

func (g *Gateway) model(ctx *fasthttp.RequestCtx, hs *reqHeaders, id []byte) {
	snap := g.snap.Load()
	r := snap.route(id)
	if r != nil && r.keyed {
		// A keyed org's model is visible to its own keys only.
		if org, ok, _ := snap.keyOrg(ctx.Request.Header.Peek("Authorization"), nil); !ok || org != r.org {
			r = nil
		}
	}
	if r == nil {
		g.refuse(ctx, hs, modelNotFound(id))
		return
	}
	b := append([]byte(`{"id":`), appendJSONString(nil, r.Model)...)
	b = append(b, `,"object":"model","created":0,"owned_by":"rolter"}`...)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// invalidKey answers a request to a route that needs a data-plane key without a valid one.
func invalidKey() *apiError {
	return &apiError{status: fasthttp.StatusUnauthorized, typ: typeAuth, code: "invalid_api_key",
		message: "Incorrect API key provided.", noRetry: true}
}

func modelNotFound(model []byte) *apiError {
	return &apiError{status: fasthttp.StatusNotFound, typ: typeInvalidRequest, code: "model_not_found", param: "model",
		message: modelNotFoundMessage(model), noRetry: true}
}

// modelNotFoundMessage names the model, as OpenAI and vLLM do, only when it looks like a model name (at most
// 128 bytes of letters, digits and ._:/@+-); anything else a client sent is not echoed back.
func modelNotFoundMessage(model []byte) string {
	if len(model) == 0 || len(model) > 128 {
		return "The requested model does not exist."
	}
	for _, c := range model {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._:/@+-", c) >= 0) {
			return "The requested model does not exist."
		}
	}
	return "The model `" + string(model) + "` does not exist."
}

// onlyGet reports whether the request is a GET or a HEAD, and refuses it otherwise.
func (g *Gateway) onlyGet(ctx *fasthttp.RequestCtx, hs *reqHeaders) bool {
	if ctx.IsGet() || ctx.IsHead() {
		return true
	}
	ctx.Response.Header.Set("Allow", "GET, HEAD")
	g.refuse(ctx, hs, &apiError{status: fasthttp.StatusMethodNotAllowed, typ: typeInvalidRequest, code: "method_not_allowed",
		message: "this method is not allowed here; use GET", noRetry: true})
	return false
}

// refuse answers a request the gateway refuses before post takes it: it begins the request's call, so
// that the refusal is answered (writeError) and ends (finish) the way every request does.
func (g *Gateway) refuse(ctx *fasthttp.RequestCtx, hs *reqHeaders, e *apiError) {
	g.begin(ctx, hs, loggedPath(ctx.Path())).answerError(ctx, e)
}

// serverError answers requests fasthttp could not parse, in OpenAI's shape.
func (g *Gateway) serverError(ctx *fasthttp.RequestCtx, err error) {
	var e *apiError
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		e = &apiError{status: fasthttp.StatusRequestEntityTooLarge, typ: typeInvalidRequest, code: "request_too_large",
			message: fmt.Sprintf("request body exceeds server.max_body_bytes (%d)", g.snap.Load().cfg.Server.MaxBodyBytes), noRetry: true}
	case errors.Is(err, clientconn.ErrBareLF):
		e = badRequest("bad_request", "", "request head lines must end in CRLF, not a bare LF (RFC 9112 section 2.2)")
	case errors.Is(err, clientconn.ErrNotRequest):
		e = badRequest("bad_request", "", "the bytes received do not begin an HTTP/1.1 request line (TLS sent to a plain-HTTP port?)")
	case errors.As(err, &small):
		e = &apiError{status: fasthttp.StatusRequestHeaderFieldsTooLarge, typ: typeInvalidRequest, code: "header_too_large",
			message: fmt.Sprintf("request headers exceed server.max_header_bytes (%d)", g.snap.Load().cfg.Server.MaxHeaderBytes), noRetry: true}
	default:
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			e = &apiError{status: fasthttp.StatusRequestTimeout, typ: typeInvalidRequest, code: "request_timeout",
				message: "timed out reading the request", noRetry: false}
		} else {
			// The parser's error text is not echoed: it may quote request bytes.
			e = &apiError{status: fasthttp.StatusBadRequest, typ: typeInvalidRequest, code: "bad_request",
				message: "cannot parse the HTTP request", noRetry: true}
		}
	}
	g.log.Debug("request refused by the HTTP parser", "client", ctx.RemoteAddr().String(), "error", err.Error())
	clientconn.CloseAfter(ctx) // fasthttp closes the connection after this answer, with the rest of the request unread
	// The head was not read whole: only its request id is looked up, and the path is not trusted.
	hs := reqHeaders{requestID: ctx.Request.Header.Peek("X-Request-Id")}
	g.begin(ctx, &hs, "").answerError(ctx, e)
}

// requestID appends id, the client's x-request-id, if it is sane, or else a fresh random one to dst.
func requestID(id, dst []byte) []byte {
	if len(id) > 0 && len(id) <= 128 && printableASCII(id) {
		return append(dst, id...)
	}
	const hex = "0123456789abcdef"
	x := rand.Uint64()
	for i := 0; i < 16; i++ {
		dst = append(dst, hex[x>>60])
		x <<= 4
	}
	return dst
}

func printableASCII(b []byte) bool {
	for _, c := range b {
		if c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

type fasthttpLogger struct{ log *slog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Debug(fmt.Sprintf(format, args...), "component", "fasthttp")
}

// waitGroup waits for wg, or until ctx is done.
func waitGroup(ctx context.Context, wg *sync.WaitGroup) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}
