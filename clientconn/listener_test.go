package clientconn

import (
	"bufio"
	"bytes"
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
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

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
func testLimiter(t *testing.T, max, perIP int, grace time.Duration) (*Limiter, *limitListener, <-chan *clientConn) {
	t.Helper()
	l := &Limiter{log: testLogger(t), global: testGlobal(t), budget: &Budget{limit: 1000}, max: max, perIP: perIP, grace: grace}
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := l.Listener(tcp)
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
func serveOne(t *testing.T, l *Limiter, c *clientConn) {
	t.Helper()
	var b [64]byte
	if _, err := c.Read(b[:]); err != nil {
		t.Fatalf("reading the request: %s", err)
	}
	l.ConnState(c, fasthttp.StateActive)
	l.ConnState(c, fasthttp.StateIdle)
}

func (l *Limiter) openConns() int {
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

	l.ConnState(c, fasthttp.StateIdle)
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
	if !l.budget.Take() { // an upstream connection
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
	l.budget.Put() // the upstream connection closed
	next(t, accepted, "b once the upstream connection gave its unit back")
	if got := l.budget.InUse(); got != 2 {
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
	l := &Limiter{log: testLogger(t), global: testGlobal(t), budget: &Budget{}, max: 10, grace: time.Hour}
	p1, p2 := net.Pipe()
	defer p2.Close()
	inner := &errListener{closed: make(chan struct{}), conns: []net.Conn{p1}, errs: []error{
		acceptErr(syscall.EMFILE), acceptErr(syscall.ENFILE), acceptErr(syscall.ENOBUFS), acceptErr(syscall.ENOMEM),
		acceptErr(syscall.ECONNABORTED), timeoutErr{},
	}}
	ln := l.Listener(inner)
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
	ln2 := l.Listener(inner2)
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
		fmt.Fprintf(ctx, "tls=%v raw=%v", ctx.IsTLS(), RawConn(ctx.Conn()) != nil)
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
// later read all fail at once with ErrBareLF.
func TestBareLFHeadsTLS(t *testing.T) {
	l := testGlobalLimiter(t)
	c := serveTLS(t, l, &fasthttp.Server{StreamRequestBody: true, ReduceMemoryUsage: true, ReadTimeout: time.Minute,
		Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") },
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			ctx.SetStatusCode(fasthttp.StatusBadRequest)
			fmt.Fprintf(ctx, "bare LF: %v", errors.Is(err, ErrBareLF))
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
func serveTLS(t *testing.T, l *Limiter, s *fasthttp.Server) *tls.Conn {
	t.Helper()
	tcp := mustListen(t)
	s.ConnState = l.ConnState
	ln := l.Listener(tls.NewListener(tcp, &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}}))
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

func testGlobalLimiter(t *testing.T) *Limiter {
	return &Limiter{log: testLogger(t), global: testGlobal(t), budget: &Budget{limit: 100}, max: 10, grace: time.Hour}
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

func TestListenerConnStateAllocs(t *testing.T) {
	l := testGlobalLimiter(t)
	p1, p2 := net.Pipe()
	defer p2.Close()
	c := l.admit(p1, nil)
	defer c.Close()
	l.ConnState(c, fasthttp.StateActive)
	if n := testing.AllocsPerRun(100, func() {
		l.ConnState(c, fasthttp.StateIdle)
		l.ConnState(c, fasthttp.StateActive)
	}); n != 0 {
		t.Fatalf("%v allocations per idle/active round", n)
	}
}

func BenchmarkListenerConnState(b *testing.B) {
	l := &Limiter{log: quietLog(), global: testGlobal(b), budget: &Budget{}, max: 1 << 20, grace: time.Hour}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		p1, p2 := net.Pipe()
		defer p2.Close()
		c := l.admit(p1, nil)
		defer c.Close()
		for pb.Next() {
			c.activate()
			l.ConnState(c, fasthttp.StateIdle)
		}
	})
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

// TestLingeringCloseTLS: over TLS too, a client still writing an over-long header reads its 431 and the
// end of the connection (close_notify, then FIN), not a reset.
func TestLingeringCloseTLS(t *testing.T) {
	l := testGlobalLimiter(t)
	l.linger = 300 * time.Millisecond
	c := serveTLS(t, l, &fasthttp.Server{ReadBufferSize: 4096, Handler: func(ctx *fasthttp.RequestCtx) {},
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			CloseAfter(ctx)
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

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
