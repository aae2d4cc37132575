package engine

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/clientconn"
	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/egress"
)

// upstream is the connection pool of one provider.
//
// Why not fasthttp.HostClient: the gateway must (1) close the upstream connection the moment a client of a
// non-streaming request goes away, while the handler is still waiting for the response headers, so the
// engine stops generating (HostClient never exposes the connection of an in-flight request), and (2) bound
// the wait for headers and each gap between body reads separately (HostClient's read deadline stays active
// for the whole streamed body, capping long generations: fasthttp client.go field docs of ReadTimeout and
// DoDeadline; docs/internals/fasthttp.md). So this pool owns the
// connections and reuses fasthttp's HTTP/1.1 response parser and body streams on them.
//
// upstream is safe for concurrent use.
type upstream struct {
	name        string
	addr        string // host:port to dial
	host        string // api_base's host name (SGLang's bootstrap_host of a prefill engine)
	tlsConfig   *tls.Config
	hostHeader  string // Host header value
	basePath    string // api_base path prefix without a trailing slash, "/v1" de-duplicated (see requestPath)
	dialTimeout time.Duration
	headersWait time.Duration
	idleGap     time.Duration
	maxIdleAge  time.Duration
	maxConns    int64

	// dial replaces net.Dial in tests and benchmarks (in-memory listeners).
	dial func(addr string, timeout time.Duration) (net.Conn, error)

	open atomic.Int64
	// budget is the gateway's socket budget, shared with client connections (nil: unlimited).
	budget *clientconn.Budget

	mu     sync.Mutex
	idle   []*uconn // LIFO: the most recently used connection is hottest
	closed bool
}

// errTooManyConns is returned when a provider already has max_conns connections open.
var errTooManyConns = errors.New("too many open connections to the provider")

func newUpstream(name, apiBase string, maxConns int, t config.TimeoutsConfig) (*upstream, error) {
	u, err := url.Parse(apiBase)
	if err != nil {
		return nil, fmt.Errorf("cannot parse api_base %q: %w", apiBase, err)
	}
	up := &upstream{
		name:        name,
		hostHeader:  u.Host,
		host:        u.Hostname(),
		dialTimeout: secs(t.ConnectSecs),
		headersWait: secs(t.HeadersSecs),
		idleGap:     secs(t.IdleSecs),
		// Below uvicorn's default keep-alive of 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE), so a pooled connection is
		// not reused just as vLLM closes it (vLLM vllm/envs.py; fasthttp issues #818, #1892).
		maxIdleAge: 4 * time.Second,
		maxConns:   int64(maxConns),
	}
	port := u.Port()
	switch u.Scheme {
	case "https":
		if port == "" {
			port = "443"
		}
		up.tlsConfig = &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
	default:
		if port == "" {
			port = "80"
		}
	}
	up.addr = net.JoinHostPort(u.Hostname(), port)
	up.basePath = strings.TrimSuffix(u.Path, "/")
	return up, nil
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// requestPath returns the upstream path for a client path such as "/v1/chat/completions", appended to dst.
// An api_base that already ends in "/v1" (the OpenAI SDK convention) does not double it.
func (u *upstream) requestPath(dst []byte, path []byte) []byte {
	base := u.basePath
	if strings.HasSuffix(base, "/v1") && len(path) >= 4 && string(path[:4]) == "/v1/" {
		base = base[:len(base)-3]
	}
	dst = append(dst, base...)
	return append(dst, path...)
}

// acquire returns a pooled connection or dials a new one. A pooled connection with anything to read - bytes
// the upstream sent beyond its last response (an over-long body, a body on a 204, an unsolicited response)
// or its close - is closed, never reused: those bytes would be read as the next client's answer.
func (u *upstream) acquire() (*uconn, error) {
	now := time.Now()
	u.mu.Lock()
	for len(u.idle) > 0 {
		c := u.idle[len(u.idle)-1]
		u.idle[len(u.idle)-1] = nil
		u.idle = u.idle[:len(u.idle)-1]
		u.mu.Unlock()
		if now.Sub(c.lastUsed) < u.maxIdleAge && c.quiet() {
			c.reused = true
			return c, nil
		}
		c.close()
		u.mu.Lock()
	}
	u.mu.Unlock()
	return u.dialConn()
}

func (u *upstream) dialConn() (*uconn, error) {
	if u.open.Add(1) > u.maxConns {
		u.open.Add(-1)
		return nil, errTooManyConns
	}
	if !u.budget.Take() {
		u.open.Add(-1)
		return nil, errTooManyConns
	}
	var nc net.Conn
	var err error
	if u.dial != nil {
		nc, err = u.dial(u.addr, u.dialTimeout)
	} else {
		nc, err = net.DialTimeout("tcp", u.addr, u.dialTimeout)
	}
	if err != nil {
		u.open.Add(-1)
		u.budget.Put()
		kind := failConnect
		var refused *egress.Refusal
		if errors.As(err, &refused) {
			kind = failEgress
		}
		return nil, &upstreamError{kind: kind, err: err}
	}
	if u.tlsConfig != nil {
		tc := tls.Client(nc, u.tlsConfig)
		_ = tc.SetDeadline(time.Now().Add(u.dialTimeout))
		if err := tc.Handshake(); err != nil {
			_ = nc.Close()
			u.open.Add(-1)
			u.budget.Put()
			return nil, &upstreamError{kind: failConnect, err: fmt.Errorf("cannot complete TLS handshake: %w", err)}
		}
		_ = tc.SetDeadline(time.Time{})
		nc = tc
	}
	c := &uconn{up: u, nc: nc, rc: clientconn.RawConn(nc), fd: -1}
	if c.rc != nil {
		_ = c.rc.Control(func(fd uintptr) { c.fd = int(fd) })
	}
	c.send = c.sendFD
	c.br = bufio.NewReaderSize(readerFunc{c}, 16<<10)
	c.bw = bufio.NewWriterSize(writerFunc{c}, 16<<10)
	return c, nil
}

// release returns a connection whose last response was read completely to the pool. A connection closed
// meanwhile (by the client-disconnect watcher) is dropped, and one with bytes buffered past that response is
// closed (see acquire).
func (u *upstream) release(c *uconn) {
	if c.closed.Load() {
		return
	}
	if c.br.Buffered() > 0 {
		c.close()
		return
	}
	c.gap = 0
	c.lastUsed = time.Now()
	u.mu.Lock()
	if !u.closed {
		u.idle = append(u.idle, c)
		u.mu.Unlock()
		return
	}
	u.mu.Unlock()
	c.close()
}

// closeIdle closes pooled connections idle for longer than maxIdleAge (all of them when all is true).
func (u *upstream) closeIdle(all bool) {
	now := time.Now()
	var stale []*uconn
	u.mu.Lock()
	if all {
		u.closed = true
	}
	kept := u.idle[:0]
	for _, c := range u.idle {
		if all || now.Sub(c.lastUsed) >= u.maxIdleAge {
			stale = append(stale, c)
		} else {
			kept = append(kept, c)
		}
	}
	clear(u.idle[len(kept):])
	u.idle = kept
	u.mu.Unlock()
	for _, c := range stale {
		c.close()
	}
}

// uconn is one upstream connection. It is used by one request at a time; only close may be called
// concurrently (by the client-disconnect watcher).
type uconn struct {
	up       *upstream
	nc       net.Conn
	rc       syscall.RawConn // nc's socket; nil for in-memory connections
	fd       int             // rc's descriptor, to peek at the socket while idle; -1 without rc
	br       *bufio.Reader
	bw       *bufio.Writer
	resp     fasthttp.Response
	lastUsed time.Time
	reused   bool
	// gap, when > 0, pushes the read deadline to now+gap after every read that returned bytes: the idle
	// timeout between chunks of a response body. While 0 (waiting for headers) the deadline set before
	// sending the request stays absolute.
	gap time.Duration
	// send is sendFD as a func value, made once per connection so that flushAndWait allocates nothing; sent
	// and sendErr are its state. onSent, when
	// set, is called once the request is written, before the wait for the answer.
	send    func(fd uintptr) bool
	sent    bool
	sendErr error
	onSent  func()
	wrote   bool // bw wrote to the socket since the last flushAndWait (a request larger than bw)
	// rd and wd arm nc's deadlines: rd switches between the headers and the body timeouts on every request
	// (clientconn.ReadDeadline); wd asks for the same timeout on every request (clientconn.CoarseDeadline).
	rd        clientconn.ReadDeadline
	wd        clientconn.CoarseDeadline
	closeOnce sync.Once
	closed    atomic.Bool
}

type readerFunc struct{ c *uconn }

// writerFunc is bw's writer: it notes that bytes went out before flushAndWait armed the read.
type writerFunc struct{ c *uconn }

func (w writerFunc) Write(p []byte) (int, error) {
	w.c.wrote = true
	return w.c.nc.Write(p)
}

func (r readerFunc) Read(p []byte) (int, error) {
	c := r.c
	n, err := c.nc.Read(p)
	for n == 0 && err != nil && c.rd.Early(err, c.nc.SetReadDeadline) {
		n, err = c.nc.Read(p)
	}
	if n > 0 && c.gap > 0 {
		_ = c.rd.SetAfter(time.Now(), c.gap, c.nc.SetReadDeadline)
	}
	return n, err
}

func (c *uconn) close() {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		_ = c.nc.Close()
		c.up.open.Add(-1)
		c.up.budget.Put()
	})
}

// quiet reports whether nothing can be read from the idle connection: no byte buffered, none waiting in the
// socket, and no close from the peer. It costs one non-blocking recv(MSG_PEEK), made on the descriptor
// directly: the call never blocks, so neither the descriptor's lock and poller state nor the scheduler's
// system-call bookkeeping is needed (through rc they cost about 900 instructions per request). The
// connection, just taken from the pool, is the caller's alone; the one close that can race with the peek -
// the client watch of the request that last used it, closing it as that request ends - leaves a peek at a
// closed (or reused) descriptor, which never reads a byte: the connection is then dropped here or when the
// request written to it fails, and that request is resent on a fresh one.
func (c *uconn) quiet() bool {
	if c.br.Buffered() > 0 {
		return false
	}
	if c.fd < 0 {
		return true
	}
	var b [1]byte
	_, _, errno := syscall.RawSyscall6(syscall.SYS_RECVFROM, uintptr(c.fd), uintptr(unsafe.Pointer(&b[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	return errno == syscall.EAGAIN
}

// flushAndWait writes what bw holds - the request - and then waits until the upstream's answer can be
// read, the read deadline passes or the connection is closed. It returns only the write's error: a failed
// wait is left for the read that follows, which fails the same way at once.
//
// The wait is armed before the write. A plain read right after the write would find nothing (the upstream
// has not answered yet) and cost a system call per request just to learn that; Go's poller forgets
// readiness it announced before a read is armed, so the only race-free order is arm, write, wait - which
// is what the RawConn's Read gives: it arms, calls sendFD (which writes and asks to wait), parks until the
// socket is readable and calls sendFD again (which ends it).
//
// A request larger than bw has had bytes written before the read could be armed, and an upstream may answer
// before it has read the whole body (a proxy's 413): that answer's readiness would be lost and the wait last
// until the headers deadline. Such a request is flushed plainly and its answer read the usual way.
func (c *uconn) flushAndWait() error {
	if c.rc == nil || c.wrote {
		return c.flush()
	}
	c.sent, c.sendErr = false, nil
	err := c.rc.Read(c.send)
	c.wrote = false
	if !c.sent {
		// The read could not be armed (the connection was closed meanwhile): nothing was written.
		return err
	}
	return c.sendErr
}

// flush writes what bw holds - the request - without waiting for the answer, which is read the usual way:
// for a hop whose answer is not read next (SGLang's prefill and decode requests go out together).
func (c *uconn) flush() error {
	err := c.bw.Flush()
	c.wrote = false
	if err == nil {
		c.written()
	}
	return err
}

func (c *uconn) sendFD(uintptr) bool {
	if c.sent {
		return true
	}
	c.sent = true
	if c.sendErr = c.bw.Flush(); c.sendErr != nil {
		return true
	}
	c.written()
	return false
}

// written calls onSent once.
func (c *uconn) written() {
	if f := c.onSent; f != nil {
		c.onSent = nil
		f()
	}
}

// startBody switches the connection from the headers deadline to the idle gap between body reads.
func (c *uconn) startBody() {
	c.gap = c.up.idleGap
	_ = c.rd.SetAfter(time.Now(), c.gap, c.nc.SetReadDeadline)
}

// failKind classifies upstream failures for retries, cooldowns and metrics.
type failKind uint8

const (
	failNone failKind = iota
	failConnect
	failTimeout
	failReset  // connection closed or reset by the upstream
	failStatus // a 502, 503, 504 or 429 answer: the engine (or what is in front of it) cannot take requests
	failProto  // an unparsable response
	failClient // the client went away (not the upstream's fault)
	failStale  // a pooled connection the upstream had already closed
	failBusy   // the provider's connection cap was reached
	// failAnswered is any other 5xx (500 above all): the engine is up and answered, but could not serve
	// this request - possibly because of the request itself.
	failAnswered
	failEgress // the egress policy refused the provider's address: nothing was sent
	numFailKinds
)

var failKindNames = [numFailKinds]string{"none", "connect", "timeout", "reset", "status", "protocol", "client", "stale", "busy", "answered_5xx", "egress"}

func (k failKind) String() string { return failKindNames[k] }

type upstreamError struct {
	kind failKind
	err  error
}

func (e *upstreamError) Error() string { return e.kind.String() + ": " + e.err.Error() }
func (e *upstreamError) Unwrap() error { return e.err }

// classify turns a read or write error into a failKind.
func classify(err error) failKind {
	var ue *upstreamError
	if errors.As(err, &ue) {
		return ue.kind
	}
	var te interface{ Timeout() bool } // net.Error and fasthttp.ErrTimeout (which lacks Temporary)
	if errors.As(err, &te) && te.Timeout() {
		return failTimeout
	}
	var se *fasthttp.ErrSmallBuffer
	if errors.As(err, &se) {
		return failProto
	}
	return failReset
}
