package engine

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/telemetry"
)

func TestConnLimits(t *testing.T) {
	g := func(nofile uint64, maxConns, control int, wantBudget int64, wantClients int) {
		t.Helper()
		budget, clients := connLimits(nofile, maxConns, control)
		if budget != wantBudget || clients != wantClients {
			t.Fatalf("connLimits(%d, %d, %d) = %d, %d; want %d, %d", nofile, maxConns, control, budget, clients, wantBudget, wantClients)
		}
	}
	f := func(nofile uint64, maxConns int, wantBudget int64, wantClients int) {
		t.Helper()
		g(nofile, maxConns, 0, wantBudget, wantClients)
	}
	f(128, 0, 64, 32)
	f(256, 0, 192, 96)
	f(1024, 0, 960, 480)
	f(1048576, 0, 1048512, 524256)
	f(100, 0, 36, 18)
	f(64, 0, 32, 16) // floors
	f(10, 0, 32, 16)
	f(1024, 100, 960, 100) // configured
	f(1024, 5000, 960, 5000)
	f(0, 0, 1<<31-1-64, (1<<31-1-64)/2)          // unknown
	f(^uint64(0), 0, 1<<31-1-64, (1<<31-1-64)/2) // RLIM_INFINITY
	// The control plane's cap comes out of the budget.
	g(256, 0, 64, 128, 64)
	g(1024, 0, 64, 896, 448)
	g(128, 0, 64, 32, 16) // floors
}

func TestConnRejectReasons(t *testing.T) {
	if telemetry.ClientRejectReasons[rejectPerIP] != "max_conns_per_ip" || telemetry.ClientRejectReasons[rejectReclaimed] != "reclaimed_idle" {
		t.Fatalf("reject reason indexes out of step with telemetry: %q", telemetry.ClientRejectReasons)
	}
}

// testGlobal returns gateway metrics for a limiter built without a Gateway, exported until tb ends as
// New and Shutdown export a gateway's.
func testGlobal(tb testing.TB) *telemetry.Global {
	g := telemetry.NewGlobal("test", time.Now(), func() bool { return false })
	g.Register()
	tb.Cleanup(g.Unregister)
	return g
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return quietLog()
}

// testLimiter returns a limiter of max client connections (perIP per address) with grace, and a listener
// of it on loopback whose accepted connections arrive on the channel. Both close at cleanup.
func testLimiter(t *testing.T, max, perIP int, grace time.Duration) (*connLimiter, *limitListener, <-chan *clientConn) {
	t.Helper()
	l := &connLimiter{log: testLogger(t), global: testGlobal(t), budget: &connBudget{limit: 1000}, max: max, perIP: perIP, grace: grace}
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := l.listener(tcp)
	accepted := make(chan *clientConn, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c.(*clientConn)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for {
			select {
			case c := <-accepted:
				c.Close()
			default:
				return
			}
		}
	})
	return l, ln, accepted
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func next(t *testing.T, accepted <-chan *clientConn, what string) *clientConn {
	t.Helper()
	select {
	case c := <-accepted:
		return c
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s to be accepted", what)
		return nil
	}
}

func noneAccepted(t *testing.T, accepted <-chan *clientConn, d time.Duration, why string) {
	t.Helper()
	select {
	case c := <-accepted:
		t.Fatalf("accepted %s: %s", c.RemoteAddr(), why)
	case <-time.After(d):
	}
}

// closedByPeer reports whether the client side c sees the server close it (EOF or reset) within d.
func closedByPeer(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	var b [1]byte
	_, err := c.Read(b[:])
	return err != nil && !isTimeout(err)
}

// serveOne plays fasthttp for one request on the server side c: reads what the client sent, then goes idle.
func serveOne(t *testing.T, l *connLimiter, c *clientConn) {
	t.Helper()
	var b [64]byte
	if _, err := c.Read(b[:]); err != nil {
		t.Fatalf("reading the request: %s", err)
	}
	l.connState(c, fasthttp.StateActive)
	l.connState(c, fasthttp.StateIdle)
}

func (l *connLimiter) openConns() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// TestListenerReclaimIdle: at the cap the idle keep-alive connection is closed for the newcomer, a fresh one
// within its grace is not; with nothing reclaimable the listener waits (without spinning) for a close.
func TestListenerReclaimIdle(t *testing.T) {
	l, ln, accepted := testLimiter(t, 2, 0, time.Hour)
	addr := ln.Addr().String()

	a := dial(t, addr)
	sa := next(t, accepted, "a")
	a.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	serveOne(t, l, sa)

	b := dial(t, addr)
	sb := next(t, accepted, "b")

	_ = dial(t, addr)
	sc := next(t, accepted, "c at the cap")
	if !closedByPeer(a, 5*time.Second) {
		t.Fatalf("the idle connection was not closed for the newcomer")
	}
	if closedByPeer(b, 100*time.Millisecond) {
		t.Fatalf("a fresh connection within its grace was closed")
	}
	if got := l.reclaimed.Load(); got != 1 {
		t.Fatalf("reclaimed %d connections, want 1", got)
	}

	// b and c are fresh for an hour: d waits, sleeping rather than spinning, until one of them closes.
	_ = dial(t, addr)
	waits := l.waits.Load()
	noneAccepted(t, accepted, 300*time.Millisecond, "nothing was reclaimable")
	if n := l.waits.Load() - waits; n > 2 {
		t.Fatalf("the waiting listener woke %d times in 300ms with nothing changing", n)
	}
	sb.Close()
	sd := next(t, accepted, "d after a close")
	if got := l.openConns(); got != 2 {
		t.Fatalf("%d open connections, want 2", got)
	}
	_, _ = sc, sd
}

// TestListenerReclaimSkipsArrivingRequest: an idle connection whose next request is already in its socket is
// left alone; it is reclaimed once that request is served and it is idle again.
func TestListenerReclaimSkipsArrivingRequest(t *testing.T) {
	l, ln, accepted := testLimiter(t, 1, 0, time.Hour)
	addr := ln.Addr().String()
	a := dial(t, addr)
	sa := next(t, accepted, "a")
	a.Write([]byte("one"))
	serveOne(t, l, sa)
	a.Write([]byte("two")) // the next request, not read yet
	waitFor(t, 5*time.Second, "the request bytes to arrive", sa.pending)

	_ = dial(t, addr)
	noneAccepted(t, accepted, 200*time.Millisecond, "the only connection had a request arriving")
	if l.reclaimed.Load() != 0 || closedByPeer(a, 50*time.Millisecond) {
		t.Fatalf("closed a connection whose request was arriving")
	}
	serveOne(t, l, sa) // reads "two", goes idle: now reclaimable
	next(t, accepted, "b once a was idle")
	if !closedByPeer(a, 5*time.Second) || l.reclaimed.Load() != 1 {
		t.Fatalf("the idle connection was not reclaimed (reclaimed %d)", l.reclaimed.Load())
	}
}

// TestListenerReclaimLosesToReader: a reader that saw request bytes first keeps its connection; a reader that
// comes after the reclaim reads the connection as closed.
func TestListenerReclaimLosesToReader(t *testing.T) {
	l, ln, accepted := testLimiter(t, 10, 0, time.Hour)
	_ = dial(t, ln.Addr().String())
	c := next(t, accepted, "a")

	l.mu.Lock()
	l.unlinkLocked(c)
	c.state.Store(connReclaiming)
	l.mu.Unlock()
	if !c.activate() {
		t.Fatalf("activate lost to a reclaim that had not decided yet")
	}
	if l.reclaim(c) {
		t.Fatalf("reclaimed a connection that became active")
	}

	l.connState(c, fasthttp.StateIdle)
	l.mu.Lock()
	l.unlinkLocked(c)
	c.state.Store(connReclaiming)
	l.mu.Unlock()
	if !l.reclaim(c) {
		t.Fatalf("did not reclaim an idle connection")
	}
	if c.activate() {
		t.Fatalf("activate after the reclaim reported the connection alive")
	}
	if got := l.openConns(); got != 0 {
		t.Fatalf("%d open after the reclaim", got)
	}
}

// TestListenerFreshGrace: a connection that sent nothing is reclaimed only after its grace, counted (on
// Linux) from its handshake, so a connection that waited its grace out in the listen backlog goes at once.
func TestListenerFreshGrace(t *testing.T) {
	const grace = time.Second
	l, ln, accepted := testLimiter(t, 1, 0, grace)
	addr := ln.Addr().String()
	a := dial(t, addr)
	start := time.Now()
	next(t, accepted, "a")
	b := dial(t, addr) // accepted and held at the cap
	c := dial(t, addr) // waits in the backlog
	next(t, accepted, "b")
	bIn := time.Now()
	if d := bIn.Sub(start); d < grace*9/10 {
		t.Fatalf("the fresh connection was reclaimed after %s, before its grace %s", d, grace)
	}
	if !closedByPeer(a, 5*time.Second) {
		t.Fatalf("a was not closed")
	}
	next(t, accepted, "c")
	cIn := time.Now()
	if runtime.GOOS == "linux" {
		// b's handshake was before a's grace ran out, so b was due at once too.
		if d := cIn.Sub(bIn); d > grace/2 {
			t.Fatalf("c waited %s after b, want well under the grace %s: backlog time not counted", d, grace)
		}
	}
	if !closedByPeer(b, 5*time.Second) || l.reclaimed.Load() != 2 {
		t.Fatalf("b was not reclaimed (reclaimed %d)", l.reclaimed.Load())
	}
	_ = c
}

// TestListenerBudgetShared: with room under max_conns but the socket budget spent elsewhere (upstream
// connections), a new client connection waits until a unit comes back.
func TestListenerBudgetShared(t *testing.T) {
	l, ln, accepted := testLimiter(t, 10, 0, time.Hour)
	l.budget.limit = 2
	if !l.budget.take() { // an upstream connection
		t.Fatal("budget spent")
	}
	addr := ln.Addr().String()
	_ = dial(t, addr)
	next(t, accepted, "a")
	_ = dial(t, addr)
	waits := l.waits.Load()
	noneAccepted(t, accepted, 300*time.Millisecond, "the budget was spent")
	// Polled every budgetPoll (100 ms): a handful of wake-ups, not a spin.
	if n := l.waits.Load() - waits; n > 6 {
		t.Fatalf("%d wake-ups in 300ms waiting on the budget", n)
	}
	l.budget.put() // the upstream connection closed
	next(t, accepted, "b once the upstream connection gave its unit back")
	if got := l.budget.inUse(); got != 2 {
		t.Fatalf("budget in use %d, want 2", got)
	}
}

// TestConnOpenFileLimitRaised: a soft limit under the hard one is raised to it.
func TestConnOpenFileLimitRaised(t *testing.T) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Max < 1024 || rl.Max > 1<<30 {
		t.Skipf("hard limit %d", rl.Max)
	}
	low := syscall.Rlimit{Cur: rl.Max - 1, Max: rl.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	defer syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	lim := raiseOpenFileLimit()
	if lim.err != nil || !lim.raised || lim.soft != uint64(rl.Max) || lim.hard != uint64(rl.Max) {
		t.Fatalf("raiseOpenFileLimit() = %+v; want raised to %d", lim, rl.Max)
	}
	var now syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &now); err != nil || now.Cur != rl.Max {
		t.Fatalf("soft limit %d after raising, want %d (%v)", now.Cur, rl.Max, err)
	}
	if lim := raiseOpenFileLimit(); lim.raised || lim.err != nil {
		t.Fatalf("raised again: %+v", lim)
	}
}

// TestListenerMaxConnsPerIP: a connection over max_conns_per_ip is closed at once, without a response, and
// counted; one more fits once another closes.
func TestListenerMaxConnsPerIP(t *testing.T) {
	l, ln, accepted := testLimiter(t, 100, 2, time.Hour)
	addr := ln.Addr().String()
	_ = dial(t, addr)
	sa := next(t, accepted, "a")
	_ = dial(t, addr)
	next(t, accepted, "b")
	c := dial(t, addr)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 64)); n != 0 || err == nil {
		t.Fatalf("over the per-address cap: read %d bytes, %v; want the connection closed with nothing", n, err)
	}
	if got := l.perIPRejected.Load(); got != 1 {
		t.Fatalf("counted %d refusals, want 1", got)
	}
	var m bytes.Buffer
	metrics.WritePrometheus(&m, false)
	if !strings.Contains(m.String(), `rolter_client_connections_rejected_total{reason="max_conns_per_ip"}`) {
		t.Fatalf("refusal not in the metrics")
	}
	sa.Close()
	_ = dial(t, addr)
	next(t, accepted, "d after a closed")
	l.mu.Lock()
	n := l.byIP[netip.MustParseAddr("127.0.0.1")]
	l.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d connections counted for 127.0.0.1, want 2", n)
	}
}

// errListener fails Accept with errs in turn, then with the last one forever (or hands out conns if any).
type errListener struct {
	mu     sync.Mutex
	errs   []error
	conns  []net.Conn
	calls  atomic.Int64
	closed chan struct{}
	once   sync.Once
}

func (e *errListener) Accept() (net.Conn, error) {
	e.calls.Add(1)
	select {
	case <-e.closed:
		return nil, net.ErrClosed
	default:
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.errs) > 0 {
		err := e.errs[0]
		if len(e.errs) > 1 || len(e.conns) > 0 {
			e.errs = e.errs[1:]
		}
		return nil, err
	}
	c := e.conns[0]
	e.conns = e.conns[1:]
	return c, nil
}

func (e *errListener) Close() error   { e.once.Do(func() { close(e.closed) }); return nil }
func (e *errListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "accept: i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func acceptErr(errno syscall.Errno) error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}
}

// TestListenerAcceptBackoff: failed accepts are retried with backoff and never reach fasthttp; Close ends a
// backoff at once.
func TestListenerAcceptBackoff(t *testing.T) {
	l := &connLimiter{log: testLogger(t), global: testGlobal(t), budget: &connBudget{}, max: 10, grace: time.Hour}
	p1, p2 := net.Pipe()
	defer p2.Close()
	inner := &errListener{closed: make(chan struct{}), conns: []net.Conn{p1}, errs: []error{
		acceptErr(syscall.EMFILE), acceptErr(syscall.ENFILE), acceptErr(syscall.ENOBUFS), acceptErr(syscall.ENOMEM),
		acceptErr(syscall.ECONNABORTED), timeoutErr{},
	}}
	ln := l.listener(inner)
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("Accept returned %v", err)
	}
	defer c.Close()
	if got := l.acceptErrors.Load(); got != 6 {
		t.Fatalf("counted %d accept errors, want 6", got)
	}

	// EMFILE forever: few retries, and Close ends the wait.
	inner2 := &errListener{closed: make(chan struct{}), errs: []error{acceptErr(syscall.EMFILE)}}
	ln2 := l.listener(inner2)
	res := make(chan error, 1)
	go func() {
		_, err := ln2.Accept()
		res <- err
	}()
	time.Sleep(300 * time.Millisecond)
	// 5, 10, 20, 40, 80, 160 ms: about 7 attempts in 300 ms; a spin would make thousands.
	if n := inner2.calls.Load(); n > 20 {
		t.Fatalf("%d accept attempts in 300ms: no backoff", n)
	}
	ln2.Close()
	select {
	case err := <-res:
		if err == nil || !strings.Contains(err.Error(), "use of closed network connection") {
			t.Fatalf("Accept after Close returned %v; fasthttp would not see it as closed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("Accept still in backoff after Close")
	}
}

// TestListenerTLS: over a TLS listener fasthttp still sees a TLS connection, and the client watch still
// reaches the socket.
func TestListenerTLS(t *testing.T) {
	l := testGlobalLimiter(t)
	c := serveTLS(t, l, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		fmt.Fprintf(ctx, "tls=%v raw=%v", ctx.IsTLS(), rawConn(ctx.Conn()) != nil)
	}})
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 100))
	if string(body) != "tls=true raw=true" {
		t.Fatalf("handler saw %q", body)
	}
	if got := l.openConns(); got != 1 {
		t.Fatalf("%d open connections, want 1", got)
	}
}

// TestBareLFHeadsTLS: over TLS a head is decrypted above the socket, so its bare LF is seen in what fasthttp
// reads (watchHead): a fresh connection's head, a keep-alive one's next and one whose empty line comes in a
// later read all fail at once with errBareLF.
func TestBareLFHeadsTLS(t *testing.T) {
	l := testGlobalLimiter(t)
	c := serveTLS(t, l, &fasthttp.Server{StreamRequestBody: true, ReduceMemoryUsage: true, ReadTimeout: time.Minute,
		Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") },
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			ctx.SetStatusCode(fasthttp.StatusBadRequest)
			fmt.Fprintf(ctx, "bare LF: %v", errors.Is(err, errBareLF))
		}})
	const bad = "GET / HTTP/1.1\r\nHost: x\nAccept: */*\n\n"
	for _, how := range []string{"fresh", "after a request", "split"} {
		if how != "fresh" {
			var err error
			if c, err = tls.Dial("tcp", c.RemoteAddr().String(), &tls.Config{InsecureSkipVerify: true}); err != nil {
				t.Fatal(err)
			}
			defer c.Close()
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(c)
		if how == "after a request" {
			fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("first request: %v", err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
		}
		if how == "split" {
			fmt.Fprint(c, bad[:len(bad)-1])
			time.Sleep(50 * time.Millisecond)
			fmt.Fprint(c, bad[len(bad)-1:])
		} else {
			fmt.Fprint(c, bad)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v (no answer before the client's 5 s deadline)", how, err)
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 100))
		if resp.StatusCode != 400 || string(body) != "bare LF: true" {
			t.Fatalf("%s: answer %d %q", how, resp.StatusCode, body)
		}
	}
}

// serveTLS serves s (its ConnState set to l's) over TLS through l until the test ends, and returns a TLS
// client connection to it.
func serveTLS(t *testing.T, l *connLimiter, s *fasthttp.Server) *tls.Conn {
	t.Helper()
	tcp := mustListen(t)
	s.ConnState = l.connState
	ln := l.listener(tls.NewListener(tcp, &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}}))
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Shutdown(); <-done })
	c, err := tls.Dial("tcp", tcp.Addr().String(), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func testGlobalLimiter(t *testing.T) *connLimiter {
	return &connLimiter{log: testLogger(t), global: testGlobal(t), budget: &connBudget{limit: 100}, max: 10, grace: time.Hour}
}

func mustListen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// withServer puts lines at the top of the [server] section of a gatewayConfig.
func withServer(cfg, lines string) string {
	return strings.Replace(cfg, "[server]\n", "[server]\n"+lines, 1)
}

// TestListenerCapWaitsForActive: with every connection busy, a request waits in the backlog and is served
// once a stream ends and its connection goes idle; the budget is given back as connections close.
func TestListenerCapWaitsForActive(t *testing.T) {
	var firstDone atomic.Int64 // unix nanos the upstream finished its first stream
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseEvents(20, 20*time.Millisecond)(w, r)
		firstDone.CompareAndSwap(0, time.Now().UnixNano())
	})
	gw := startGateway(t, withServer(gatewayConfig("round_robin", "", up.URL), "max_conns = 2\n"))
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}, Timeout: 30 * time.Second}
	defer client.Transport.(*http.Transport).CloseIdleConnections()

	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", "x", true)))
			if err != nil {
				t.Errorf("stream: %s", err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	waitFor(t, 10*time.Second, "two streams in flight", func() bool { return up.requests.Load() == 2 })
	quick := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	resp, err := quick.Get(gw.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	served := time.Now().UnixNano()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if f := firstDone.Load(); f == 0 || f > served {
		t.Fatalf("a third connection was served while both allowed connections were streaming")
	}
	wg.Wait()
	client.Transport.(*http.Transport).CloseIdleConnections()
	waitFor(t, 5*time.Second, "client connections released", func() bool {
		return gw.g.clients.openConns() == 0 && gw.g.conns.inUse() == 0
	})
}

// TestListenerGoroutines: after the listener closes and its connections are gone, no goroutine is left.
func TestListenerGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	up := newFakeUpstream(t, okJSON)
	// A short read timeout: fasthttp's drain waits 5 s for connections that never sent a byte otherwise.
	cfg, err := config.Parse([]byte(withServer(gatewayConfig("round_robin", "", up.URL), "max_conns = 4\nread_timeout_secs = 0.3\n")), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(cfg, Options{Logger: testLogger(t), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	g.server.MaxIdleWorkerDuration = 100 * time.Millisecond
	ln := mustListen(t)
	served := make(chan error, 1)
	go func() { served <- g.Serve(ln) }()
	tr := &http.Transport{}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	for i := 0; i < 3; i++ {
		resp, err := client.Post("http://"+ln.Addr().String()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", "x", false)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	var idle []net.Conn
	for i := 0; i < 10; i++ { // over max_conns: some reclaimed, some held or in the backlog at shutdown
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	for _, c := range idle {
		c.Close()
	}
	tr.CloseIdleConnections()
	up.srv.Close()
	waitFor(t, 10*time.Second, "goroutines back to the baseline", func() bool { return runtime.NumGoroutine() <= before })
	if n := g.clients.openConns(); n != 0 {
		t.Fatalf("%d client connections still counted", n)
	}
}

func TestListenerConnStateAllocs(t *testing.T) {
	l := testGlobalLimiter(t)
	p1, p2 := net.Pipe()
	defer p2.Close()
	c := l.admit(p1, nil)
	defer c.Close()
	l.connState(c, fasthttp.StateActive)
	if n := testing.AllocsPerRun(100, func() {
		l.connState(c, fasthttp.StateIdle)
		l.connState(c, fasthttp.StateActive)
	}); n != 0 {
		t.Fatalf("%v allocations per idle/active round", n)
	}
}

func BenchmarkListenerConnState(b *testing.B) {
	l := &connLimiter{log: quietLog(), global: testGlobal(b), budget: &connBudget{}, max: 1 << 20, grace: time.Hour}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		p1, p2 := net.Pipe()
		defer p2.Close()
		c := l.admit(p1, nil)
		defer c.Close()
		for pb.Next() {
			c.activate()
			l.connState(c, fasthttp.StateIdle)
		}
	})
}

// The child-process tests run a gateway under a low RLIMIT_NOFILE in a re-executed test binary
// (TestListenerChild) and drive it from here.

const childEnv = "ROLTER_LISTENER_CHILD_NOFILE"

// TestListenerChild is the gateway process of TestListenerEMFILE and TestListenerIdleFlood. It sets its
// open-file limit (soft and hard, so that New cannot raise it), serves a gateway over a fake upstream, prints
// "addr <host:port>", obeys "hog" (open files until EMFILE) and "release" on stdin, and drains on SIGTERM.
func TestListenerChild(t *testing.T) {
	v := os.Getenv(childEnv)
	if v == "" {
		t.Skip("the child process of TestListenerEMFILE and TestListenerIdleFlood")
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	var rl syscall.Rlimit
	if _, err := fmt.Sscan(v, &rl.Cur); err != nil { // Rlimit's fields are int64 on the BSDs
		t.Fatal(err)
	}
	rl.Max = rl.Cur
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	up := newFakeUpstream(t, okJSON)
	cfg, err := config.Parse([]byte(gatewayConfig("round_robin", "", up.URL)), "child.toml")
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ln := mustListen(t)
	served := make(chan error, 1)
	go func() { served <- g.Serve(ln) }()
	fmt.Printf("addr %s\n", ln.Addr())

	cmds := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			cmds <- sc.Text()
		}
		close(cmds)
	}()
	var hog []*os.File
	drain := 10 * time.Second
	for {
		select {
		case cmd, ok := <-cmds:
			if !ok { // the parent is gone: stop at once
				cmds, drain = nil, 0
				select {
				case sig <- syscall.SIGTERM:
				default:
				}
				continue
			}
			switch cmd {
			case "hog":
				for {
					f, err := os.Open(os.DevNull)
					if err != nil {
						break
					}
					hog = append(hog, f)
				}
				fmt.Printf("hogged %d\n", len(hog))
			case "release":
				for _, f := range hog {
					f.Close()
				}
				hog = nil
				fmt.Println("released")
			}
		case err := <-served: // as cmd/rolter, the process ends when Serve does
			t.Fatalf("serve stopped without a signal: %v", err)
		case <-sig:
			ctx, cancel := context.WithTimeout(context.Background(), drain)
			err := g.Shutdown(ctx)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if err := <-served; err != nil {
				t.Fatal(err)
			}
			fmt.Println("drained")
			return
		}
	}
}

type gatewayChild struct {
	cmd    *exec.Cmd
	addr   string
	stdin  io.WriteCloser
	lines  chan string
	stderr syncBuffer
	exited chan struct{}
	err    error // after exited
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func startChild(t *testing.T, nofile int) *gatewayChild {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("counts descriptors in /proc")
	}
	c := &gatewayChild{lines: make(chan string, 16), exited: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestListenerChild$", "-test.timeout=60s")
	c.cmd.Env = append(os.Environ(), childEnv+"="+strconv.Itoa(nofile))
	c.cmd.Stderr = &c.stderr
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		c.err = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
		if t.Failed() {
			t.Logf("child stderr:\n%s", c.stderr.String())
		}
	})
	c.addr = strings.TrimPrefix(c.expect(t, "addr ", 30*time.Second), "addr ")
	return c
}

// expect returns the child's next stdout line starting with prefix, skipping others.
func (c *gatewayChild) expect(t *testing.T, prefix string, d time.Duration) string {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				t.Fatalf("child exited before printing %q: %v", prefix, c.wait())
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-deadline:
			t.Fatalf("child printed no %q in %s", prefix, d)
		}
	}
}

func (c *gatewayChild) wait() error {
	<-c.exited
	return c.err
}

func (c *gatewayChild) alive() bool {
	select {
	case <-c.exited:
		return false
	default:
		return c.cmd.Process.Signal(syscall.Signal(0)) == nil
	}
}

func (c *gatewayChild) send(t *testing.T, cmd string) {
	t.Helper()
	if _, err := fmt.Fprintln(c.stdin, cmd); err != nil {
		t.Fatal(err)
	}
}

// stop sends SIGTERM and wants the child to drain and exit 0 within d.
func (c *gatewayChild) stop(t *testing.T, d time.Duration) {
	t.Helper()
	start := time.Now()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.expect(t, "drained", d)
	select {
	case <-c.exited:
	case <-time.After(d):
		t.Fatalf("child did not exit within %s of SIGTERM", d)
	}
	if c.err != nil {
		t.Fatalf("child exited with %v", c.err)
	}
	t.Logf("drained and exited %s after SIGTERM", time.Since(start).Round(time.Millisecond))
}

func (c *gatewayChild) openFDs() int {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", c.cmd.Process.Pid))
	if err != nil {
		return -1
	}
	return len(es)
}

// freshPost sends a chat request on a new connection and returns the status (0 on a transport error).
func freshPost(url string, timeout time.Duration) (int, error) {
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: timeout}
	resp, err := client.Post(url, "application/json", strings.NewReader(chatBody("m", "hello", false)))
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// dialMany opens n connections to addr that send nothing; they close at cleanup.
func dialMany(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	var next atomic.Int64
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				c, err := net.DialTimeout("tcp", addr, 10*time.Second)
				if err != nil {
					errs <- err
					return
				}
				conns[i] = c
			}
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	})
	select {
	case err := <-errs:
		t.Fatalf("cannot open idle connections: %s", err)
	default:
	}
	return conns
}

func needFDs(t *testing.T, n uint64) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || uint64(rl.Cur) < n {
		t.Skipf("needs an open-file limit of %d (have %d)", n, rl.Cur)
	}
}

// TestListenerEMFILE: a gateway out of file descriptors keeps running (accept4 failing with EMFILE is
// retried), and serves the connections that waited once descriptors are free again.
func TestListenerEMFILE(t *testing.T) {
	needFDs(t, 1024)
	c := startChild(t, 128)
	url := "http://" + c.addr + "/v1/chat/completions"
	if status, err := freshPost(url, 10*time.Second); status != 200 {
		t.Fatalf("before: status %d, %v", status, err)
	}
	c.send(t, "hog")
	t.Log(c.expect(t, "hogged", 10*time.Second))

	_ = dialMany(t, c.addr, 200) // more than the child's whole limit
	res := make(chan error, 1)
	go func() {
		status, err := freshPost(url, 30*time.Second)
		if err == nil && status != 200 {
			err = fmt.Errorf("status %d", status)
		}
		res <- err
	}()
	waitFor(t, 10*time.Second, "the child to log failing accepts", func() bool {
		return strings.Contains(c.stderr.String(), "cannot accept connections") && strings.Contains(c.stderr.String(), "too many open files")
	})
	time.Sleep(200 * time.Millisecond) // a few more failed accepts
	if !c.alive() {
		t.Fatalf("the gateway exited on EMFILE: %v", c.wait())
	}
	c.send(t, "release")
	c.expect(t, "released", 10*time.Second)
	select {
	case err := <-res:
		if err != nil {
			t.Fatalf("the request that waited through EMFILE: %s", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the request that waited through EMFILE was not answered")
	}
	if status, err := freshPost(url, 10*time.Second); status != 200 {
		t.Fatalf("after: status %d, %v", status, err)
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}).Get("http://" + c.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if n := metricValue(string(m), "rolter_accept_errors_total"); n < 1 {
		t.Fatalf("rolter_accept_errors_total = %v after EMFILE", n)
	}
	c.stop(t, 15*time.Second)
}

func metricValue(text, name string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return -1
}

// TestListenerIdleFlood is the check: 2,000 idle connections at ulimit -n 256 leave the gateway
// serving (fresh requests get in, the descriptor count stays under the limit) and draining normally.
func TestListenerIdleFlood(t *testing.T) {
	const limit, flood = 256, 2000
	needFDs(t, flood+256)
	c := startChild(t, limit)
	var maxFDs atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if n := int64(c.openFDs()); n > maxFDs.Load() {
				maxFDs.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()

	start := time.Now()
	_ = dialMany(t, c.addr, flood)
	t.Logf("%d idle connections open in %s", flood, time.Since(start).Round(time.Millisecond))
	url := "http://" + c.addr + "/v1/chat/completions"
	var slowest, first time.Duration
	for i := 0; i < 20; i++ {
		s := time.Now()
		status, err := freshPost(url, 15*time.Second)
		if status != 200 {
			t.Fatalf("request %d with %d idle connections open: status %d, %v", i, flood, status, err)
		}
		d := time.Since(s)
		if i == 0 {
			first = d
		} else {
			slowest = max(slowest, d)
		}
	}
	t.Logf("20 requests served: the first in %s, the others in at most %s", first.Round(time.Millisecond), slowest.Round(time.Millisecond))
	close(stop)
	<-sampled
	if n := maxFDs.Load(); n >= limit || n <= 0 {
		t.Fatalf("the child held %d descriptors at most; limit %d", n, limit)
	} else {
		t.Logf("at most %d descriptors open (limit %d)", n, limit)
	}
	if !strings.Contains(c.stderr.String(), "max_conns=96") {
		t.Fatalf("the start log does not show max_conns=96 for a limit of 256")
	}
	c.stop(t, 15*time.Second)
}

// TestClientConnReadAhead: fasthttp's one-byte wait for the next request takes the whole request out of the
// socket (one system call, not two); the next read gets the rest from the buffer without touching the
// socket; the pooled buffer goes back once drained; deadlines and the peer's close read as before.
func TestClientConnReadAhead(t *testing.T) {
	_, ln, accepted := testLimiter(t, 10, 0, time.Hour)
	a := dial(t, ln.Addr().String())
	s := next(t, accepted, "a")
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n" + strings.Repeat("b", 2000)
	if _, err := a.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the request in the socket", s.pending)
	var one [1]byte
	if n, err := s.Read(one[:]); n != 1 || err != nil || one[0] != 'P' {
		t.Fatalf("one-byte read: %d %q %v", n, one[:n], err)
	}
	if s.pending() {
		t.Fatalf("the one-byte read left the request in the socket: no read-ahead")
	}
	if s.ahead == nil {
		t.Fatalf("no read-ahead buffer after the one-byte read")
	}
	rest := make([]byte, 64<<10)
	n, err := s.Read(rest)
	if err != nil || string(rest[:n]) != req[1:] {
		t.Fatalf("the rest: %d bytes, %v; want %d bytes", n, err, len(req)-1)
	}
	if s.ahead != nil {
		t.Fatalf("the read-ahead buffer was kept after it was drained")
	}

	_ = s.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := s.Read(one[:]); !isTimeout(err) {
		t.Fatalf("a read past its deadline: %v, want a timeout", err)
	}
	_ = s.SetReadDeadline(time.Time{})
	a.Close()
	if n, err := s.Read(one[:]); n != 0 || err != io.EOF {
		t.Fatalf("after the peer closed: %d %v, want EOF", n, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestLingeringClose: a client still writing headers past max_header_bytes gets its 431 and then the end of
// the connection, not a reset, however long it keeps writing; the connection keeps its place until the client
// closes, or until the linger runs out for a client that neither closes nor sends. A request read whole and
// answered with Connection: close does not linger.
func TestLingeringClose(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGatewayWith(t, withServer(gatewayConfig("round_robin", "", up.URL), "max_header_bytes = 4096\n"), Options{Linger: 300 * time.Millisecond})
	huge := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Huge: " + strings.Repeat("h", 8000)

	// A gateway that would linger long: the plain close must not wait for it.
	gwLong := startGatewayWith(t, gatewayConfig("round_robin", "", up.URL), Options{Linger: time.Minute})
	plain := dial(t, gwLong.addr)
	body := chatBody("m", "hi", false)
	fmt.Fprintf(plain, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	_ = plain.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(plain); err != nil || !bytes.HasPrefix(got, []byte("HTTP/1.1 200 ")) {
		t.Fatalf("Connection: close answer: %q, %v", got, err)
	}
	waitFor(t, 5*time.Second, "a whole request answered with Connection: close to close without lingering", func() bool { return gwLong.g.clients.openConns() == 0 })

	// The gateway answers once max_header_bytes are read and closes with the rest unread; without a
	// lingering close the kernel resets the connection, and the writes that follow fail.
	c := dial(t, gw.addr)
	if got := writeOnThenRead(t, c, huge, 4); !bytes.HasPrefix(got, []byte("HTTP/1.1 431 ")) || !bytes.Contains(got, []byte(`"code":"header_too_large"`)) {
		t.Fatalf("answer: %q", got)
	}
	waitFor(t, 5*time.Second, "the client connection to be open while the client writes", func() bool { return gw.g.clients.openConns() == 1 })
	c.Close()
	waitFor(t, 5*time.Second, "the connection to close after the client did", func() bool { return gw.g.clients.openConns() == 0 })

	// A body announced over max_body_bytes is refused from the headers, before any of it was sent: nothing
	// waits unread when the gateway closes, and the client's body must still not meet a reset.
	c4 := dial(t, gw.addr)
	head := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", 100<<20)
	if got := writeOnThenRead(t, c4, head, 3); !bytes.HasPrefix(got, []byte("HTTP/1.1 413 ")) {
		t.Fatalf("answer to an announced over-long body: %q", got)
	}
	c4.Close()
	waitFor(t, 5*time.Second, "the refused client's connection to close", func() bool { return gw.g.clients.openConns() == 0 })

	// A client that sends nothing more and never closes is let go after the linger.
	c2 := dial(t, gw.addr)
	if _, err := io.WriteString(c2, huge); err != nil {
		t.Fatal(err)
	}
	_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(c2); err != nil || !bytes.HasPrefix(got, []byte("HTTP/1.1 431 ")) {
		t.Fatalf("answer: %q, %v", got, err)
	}
	waitFor(t, 5*time.Second, "the connection of a silent client to close", func() bool { return gw.g.clients.openConns() == 0 })

	// A client that keeps sending is let go after lingerRounds gaps in all.
	c3 := dial(t, gw.addr)
	if _, err := io.WriteString(c3, huge); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var werr error
	for time.Since(start) < 10*time.Second && werr == nil {
		time.Sleep(50 * time.Millisecond)
		_, werr = io.WriteString(c3, "hhhh")
	}
	if werr == nil {
		t.Fatal("the gateway still reads a client that kept writing after 10 s")
	}
	waitFor(t, 5*time.Second, "the connection of a writing client to close", func() bool { return gw.g.clients.openConns() == 0 })
}

// TestLingeringCloseTLS: over TLS too, a client still writing an over-long header reads its 431 and the
// end of the connection (close_notify, then FIN), not a reset.
func TestLingeringCloseTLS(t *testing.T) {
	l := testGlobalLimiter(t)
	l.linger = 300 * time.Millisecond
	c := serveTLS(t, l, &fasthttp.Server{ReadBufferSize: 4096, Handler: func(ctx *fasthttp.RequestCtx) {},
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			closeAfter(ctx)
			ctx.Error("header too large", fasthttp.StatusRequestHeaderFieldsTooLarge)
		}})
	if got := writeOnThenRead(t, c, "GET / HTTP/1.1\r\nHost: x\r\nX-Huge: "+strings.Repeat("h", 8000), 3); !bytes.HasPrefix(got, []byte("HTTP/1.1 431 ")) {
		t.Fatalf("answer: %q", got)
	}
	c.Close()
	waitFor(t, 5*time.Second, "the connection to close", func() bool { return l.openConns() == 0 })
}

// writeOnThenRead writes head, then 8000 more bytes n times 100 ms apart - a client still sending after the
// server answered - failing the test if a write fails; then reads to the end of the connection.
func writeOnThenRead(t *testing.T, c net.Conn, head string, n int) []byte {
	t.Helper()
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		time.Sleep(100 * time.Millisecond)
		if _, err := io.WriteString(c, strings.Repeat("h", 8000)); err != nil {
			t.Fatalf("write %d after the answer: %s", i, err)
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the answer: %s (%q)", err, got)
	}
	return got
}

// TestServerConcurrencyCoversMaxConns: fasthttp refuses connections over its Concurrency (256k by default)
// with a plain-text 503; the listener's max_conns is the cap, so the server's must not be lower.
func TestServerConcurrencyCoversMaxConns(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGateway(t, withServer(gatewayConfig("round_robin", "", up.URL), "max_conns = 300000\n"))
	if got := gw.g.server.Concurrency; got < 300000 {
		t.Fatalf("fasthttp Concurrency %d under max_conns 300000", got)
	}
}
