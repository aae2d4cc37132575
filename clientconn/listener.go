package clientconn

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/telemetry"
)

// Client connection limits. Running out of file descriptors made accept4 fail with EMFILE, which fasthttp's
// Serve treats as permanent: the process exited and cut every stream. The listener below never lets an
// accept error out, and keeps the sockets the gateway holds under the open-file limit.
const (
	// fdReserve is the descriptors kept out of the socket budget: the listener, config and log files, ZMQ
	// sockets and their internal pipes, health-check and scrape sockets, stdio, and the connection the
	// listener holds while it waits at the cap.
	fdReserve = 64
	// minConnBudget and minMaxConns keep a gateway with a tiny open-file limit usable; accept then meets
	// EMFILE and backs off rather than the budget refusing everything.
	minConnBudget = 32
	minMaxConns   = 16

	// freshGrace is how long a connection that has not sent a request byte is left alone before it counts
	// as idle: a client on another continent needs a round trip or two (TLS) before its request arrives.
	freshGrace = time.Second

	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
	// budgetPoll is how often a listener waiting on the socket budget (not on max_conns) looks again: upstream
	// connections give their units back without telling the listener.
	budgetPoll = 100 * time.Millisecond
	// parkAfter is how long a keep-alive connection waits for its next request before it is parked
	// (parkIdle); Options.ParkAfter changes it for tests.
	parkAfter = time.Second
)

// Indexes into telemetry.ClientRejectReasons.
const (
	rejectPerIP = iota
	rejectReclaimed
)

// connLimits derives the socket budget and the client connection cap from the open-file limit nofile and
// the control plane's connection cap control ([control] max_conns when it is enabled, else 0):
//
//	budget   = max(nofile - 64 - control, 32)
//	maxConns = max(budget / 2, 16)    when [server] max_conns is 0, else max_conns
//
// The 64 reserved descriptors are fdReserve. The control plane's connections are its own listener's
// (ControlListener), so whatever is sent to it the data plane keeps the rest. Half of the budget is left to
// upstream connections, which take from the same budget (Gateway.conns). Examples without a control plane:
// 128 -> 64 and 32; 256 -> 192 and 96; 1024 -> 960 and 480; 1048576 -> 1048512 and 524256. An unlimited or
// unknown (0) limit counts as 2^31-1.
func connLimits(nofile uint64, maxConns, control int) (budget int64, clients int) {
	if nofile == 0 || nofile > math.MaxInt32 {
		nofile = math.MaxInt32
	}
	budget = max(int64(nofile)-fdReserve-int64(control), minConnBudget)
	clients = maxConns
	if clients <= 0 {
		clients = int(max(budget/2, minMaxConns))
	}
	return budget, clients
}

// openFileLimit is RLIMIT_NOFILE as the gateway found and left it.
type openFileLimit struct {
	soft, hard uint64
	raised     bool
	err        error
}

// raiseOpenFileLimit raises the soft RLIMIT_NOFILE to the hard limit. Go's runtime already does so at start
// on Linux since Go 1.19 (golang/go#46279), so this is usually a no-op; doing it here keeps the limit the
// budget is derived from explicit and logged. On error the soft limit is left as it was.
func raiseOpenFileLimit() openFileLimit {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return openFileLimit{err: fmt.Errorf("cannot read RLIMIT_NOFILE: %w", err)}
	}
	// uint64 conversions: Rlimit's fields are int64 on the BSDs.
	lim := openFileLimit{soft: uint64(rl.Cur), hard: uint64(rl.Max)}
	if rl.Cur < rl.Max {
		rl.Cur = rl.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
			lim.err = fmt.Errorf("cannot raise RLIMIT_NOFILE from %d to %d: %w", lim.soft, lim.hard, err)
			return lim
		}
		lim.soft, lim.raised = uint64(rl.Max), true
	}
	return lim
}

// Limiter admits client connections under [server] max_conns and max_conns_per_ip, and charges each one
// unit of the socket budget it shares with upstream connections. One Limiter serves every listener of a
// Gateway. Safe for concurrent use.
//
// It tracks every client connection through fasthttp's Server.ConnState hook and its own Read:
//
//   - fresh: accepted, no request byte yet;
//   - active: a request is being read or served;
//   - idle: a keep-alive connection between requests, parked or not (see Parking);
//   - hijacked: handed to a hijack handler, never reclaimed.
//
// At the cap (max_conns, or no budget unit left) the listener has accepted one more connection and first
// reclaims: it closes the connection idle longest - an idle one, or a fresh one whose socket has received
// nothing for freshGrace (on Linux that time starts at the TCP handshake, so it counts the time spent in the
// listen backlog) - as nginx closes reusable connections when it runs out (ngx_drain_connections). Then the
// new connection is served. If nothing is reclaimable, the listener holds that one connection and stops
// accepting, so later clients wait in the kernel's listen backlog, until a connection closes or goes idle,
// the oldest fresh one reaches its grace, or (when the budget is the limit) budgetPoll passes.
//
// Reclaim races with the victim's next request. Both sides take the victim's mu: the reclaimer, to check
// the connection is still idle, peek at its socket (bytes waiting: a request is arriving, so it is left
// alone) and close it; the victim's reader, on the first bytes of a request, to mark it active. What
// remains: (1) a read that took the request's bytes out of the socket just before the peek, and has not yet
// taken mu: the reader then finds the connection closed, drops the bytes and reports the connection closed,
// so the request is never served and the client sees its idle connection closed - the race every
// keep-alive server has, which clients cover by retrying on a fresh connection (RFC 9112 section 9.3.1).
// It is a few instructions wide. (2) Pipelined requests: a request already buffered by fasthttp when the
// previous one finished is not in the socket, so the peek cannot see it, and fasthttp may start serving it
// on a connection just closed; its response is lost. (3) A TLS handshake in progress reads below this
// wrapper; it is protected by the socket's receive time, not by activate.
type Limiter struct {
	log    *slog.Logger
	global *telemetry.Global
	budget *Budget
	max    int           // client connections
	perIP  int           // per client address; 0: off
	grace  time.Duration // freshGrace; tests shorten it
	linger time.Duration // lingerGap (Options.Linger)
	// serve serves a connection again once its next request arrives after it was parked (the server's
	// ServeConn); nil: connections are never parked.
	serve     func(net.Conn) error
	parkAfter time.Duration
	parkers   sync.WaitGroup // park goroutines
	// headMax bounds the wait for a request head (clientConn.Read): server.max_header_bytes, past which the
	// server refuses the head at once; 0 (tests): aheadSize.
	headMax int

	// Counts for tests and logs; the metrics are in global.
	reclaimed     atomic.Int64
	perIPRejected atomic.Int64
	acceptErrors  atomic.Int64
	waits         atomic.Int64 // times admit slept at the cap
	parks         atomic.Int64 // times a connection was parked

	mu        sync.Mutex
	open      int      // admitted and not yet released
	idle      connList // keep-alive connections between requests, longest idle first
	fresh     connList // connections with no request byte yet, in accept order
	parked    connList // idle connections fasthttp let go of (parkIdle), parked longest first
	closing   bool     // shutdown: parked connections are closed, not served again
	byIP      map[netip.Addr]int
	wake      chan struct{} // closed when a connection closes or goes idle; nil while nobody waits
	lastFull  time.Time     // last "at the cap" warning
	lastPerIP time.Time     // last max_conns_per_ip warning
}

// NewLimiter raises the open-file limit, derives the socket budget and max_conns from it (connLimits),
// and logs the outcome once.
func NewLimiter(s *config.ServerConfig, control int, log *slog.Logger, global *telemetry.Global, opts Options) *Limiter {
	lim := raiseOpenFileLimit()
	if lim.err != nil {
		log.Warn("cannot adjust the open-file limit", "err", lim.err)
	}
	budget, clients := connLimits(lim.soft, s.MaxConns, control)
	log.Info("open-file limit", "limit", lim.soft, "hard", lim.hard, "raised", lim.raised,
		"max_conns", clients, "max_conns_per_ip", s.MaxConnsPerIP, "socket_budget", budget, "control_conns", control)
	if int64(clients) > budget {
		log.Warn("server.max_conns is above the socket budget the open-file limit allows; the budget applies first",
			"max_conns", clients, "socket_budget", budget)
	}
	l := &Limiter{
		log:       log,
		global:    global,
		budget:    &Budget{limit: budget},
		max:       clients,
		perIP:     s.MaxConnsPerIP,
		grace:     freshGrace,
		linger:    lingerGap,
		parkAfter: parkAfter,
		headMax:   s.MaxHeaderBytes,
	}
	if opts.Linger > 0 {
		l.linger = opts.Linger
	}
	if opts.ParkAfter > 0 {
		l.parkAfter = opts.ParkAfter
	}
	return l
}

// Options changes a Limiter's timings; a zero field keeps the default.
type Options struct {
	// Linger is how long a closing connection waits for the client to close too (lingerGap).
	Linger time.Duration
	// ParkAfter is how long a keep-alive connection waits for its next request before it is parked
	// (parkAfter).
	ParkAfter time.Duration
}

// Budget returns the socket budget the limiter charges client connections to, which upstream connections
// share.
func (l *Limiter) Budget() *Budget { return l.budget }

// Max returns the client connection cap: [server] max_conns, or the one derived from the budget.
func (l *Limiter) Max() int { return l.max }

// ParkAfter returns how long a keep-alive connection waits for its next request before it is parked.
func (l *Limiter) ParkAfter() time.Duration { return l.parkAfter }

// SetServe sets the function that serves a parked connection again once its next request arrives (the
// server's ServeConn). It must be called before the first connection is accepted; without it connections
// are never parked.
func (l *Limiter) SetServe(serve func(net.Conn) error) { l.serve = serve }

// Describe returns the limits the limiter was built with, as stable text for Gateway.Built.
func (l *Limiter) Describe() string {
	return fmt.Sprintf("max_conns=%d per_ip=%d head_max=%d", l.max, l.perIP, l.headMax)
}

// Stats is a snapshot of a limiter's counts, for tests and logs.
type Stats struct {
	Open      int   // connections admitted and not yet released
	Parked    int   // idle connections parked now
	Parks     int64 // times a connection was parked
	Reclaimed int64 // idle or fresh connections closed at the cap
}

// Stats returns the limiter's counts now.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	st := Stats{Open: l.open, Parked: l.parked.n}
	l.mu.Unlock()
	st.Parks, st.Reclaimed = l.parks.Load(), l.reclaimed.Load()
	return st
}

// Parkers returns the group of goroutines that watch parked connections: Shutdown waits for it after
// CloseParked.
func (l *Limiter) Parkers() *sync.WaitGroup { return &l.parkers }

// Listener wraps ln for fasthttp: see limitListener.
func (l *Limiter) Listener(ln net.Listener) *limitListener {
	return &limitListener{Listener: ln, l: l, done: make(chan struct{})}
}

// admit registers nc, accepted a moment ago, once it fits under max_conns and the socket budget, reclaiming
// an idle connection or waiting as needed (see Limiter). It returns nil, having closed nc, when nc is
// over max_conns_per_ip or done is closed first.
func (l *Limiter) admit(nc net.Conn, done <-chan struct{}) *clientConn {
	var ip netip.Addr
	if l.perIP > 0 {
		if ip = remoteIP(nc); ip.IsValid() && !l.reserveIP(ip) {
			_ = nc.Close()
			return nil
		}
	}
	for {
		l.mu.Lock()
		now := time.Now()
		if l.open < l.max && l.budget.Take() {
			l.open++
			c := newClientConn(nc, l, ip, now)
			l.fresh.pushBack(c)
			l.mu.Unlock()
			l.global.ClientConns(1)
			return c
		}
		if v := l.victimLocked(now); v != nil {
			l.unlinkLocked(v)
			v.state.Store(connReclaiming)
			l.mu.Unlock()
			l.reclaim(v)
			continue
		}
		wait := time.Duration(-1) // no timer: only a close or an idle connection can help
		if c := l.fresh.head; c != nil {
			wait = max(l.grace-c.freshAge(now), time.Millisecond)
		}
		if l.open < l.max && (wait < 0 || wait > budgetPoll) {
			wait = budgetPoll // room under max_conns, none in the socket budget
		}
		if l.wake == nil {
			l.wake = make(chan struct{})
		}
		wake := l.wake
		warn := now.Sub(l.lastFull) >= time.Second
		if warn {
			l.lastFull = now
		}
		open := l.open
		l.mu.Unlock()
		if warn {
			l.log.Warn("client connections at the cap; new connections wait in the listen backlog",
				"open", open, "max_conns", l.max, "sockets", l.budget.InUse(), "socket_budget", l.budget.limit)
		}
		l.waits.Add(1)
		if !sleep(wake, wait, done) {
			_ = nc.Close()
			if ip.IsValid() {
				l.mu.Lock()
				l.unreserveIPLocked(ip)
				l.mu.Unlock()
			}
			return nil
		}
	}
}

// sleep waits for wake, d (if d >= 0) or done. It reports false if done came first.
func sleep(wake <-chan struct{}, d time.Duration, done <-chan struct{}) bool {
	var tc <-chan time.Time
	if d >= 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		tc = t.C
	}
	select {
	case <-wake:
	case <-tc:
	case <-done:
		return false
	}
	return true
}

// victimLocked returns the connection idle longest: the oldest idle or parked one, or the oldest fresh one if
// it has been quiet for the grace period and longer. The fresh list is in accept order, which is the order the
// handshakes completed in (the accept queue is FIFO), so its head is the oldest.
func (l *Limiter) victimLocked(now time.Time) *clientConn {
	var v *clientConn
	longest := time.Duration(-1)
	if c := l.idle.head; c != nil {
		v, longest = c, now.Sub(c.since)
	}
	if c := l.parked.head; c != nil && now.Sub(c.since) > longest {
		v, longest = c, now.Sub(c.since)
	}
	if c := l.fresh.head; c != nil {
		if age := c.freshAge(now); age >= l.grace && age > longest {
			v = c
		}
	}
	return v
}

// reclaim closes v, which admit took off its list and marked connReclaiming, unless a request got to it
// first. It reports whether v was closed.
func (l *Limiter) reclaim(v *clientConn) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.state.Load() != connReclaiming {
		return false // its reader saw request bytes first (activate)
	}
	if v.pending() {
		// A request is arriving; its reader will find the connection active.
		v.state.Store(connActive)
		return false
	}
	v.state.Store(connClosed)
	// Released before the close, which wakes the connection's goroutine: it would release it first.
	released := v.release()
	// The socket, not a TLS layer: closing the TLS layer writes an alert, which could block.
	_ = v.raw.Close()
	if !released {
		return false // closed by its own goroutine meanwhile
	}
	l.reclaimed.Add(1)
	l.global.ClientRejected(rejectReclaimed)
	return true
}

func (l *Limiter) reserveIP(ip netip.Addr) bool {
	l.mu.Lock()
	n := l.byIP[ip]
	if n >= l.perIP {
		now := time.Now()
		warn := now.Sub(l.lastPerIP) >= time.Second
		if warn {
			l.lastPerIP = now
		}
		l.mu.Unlock()
		l.perIPRejected.Add(1)
		l.global.ClientRejected(rejectPerIP)
		if warn {
			l.log.Warn("client connection refused: over server.max_conns_per_ip", "client", ip.String(), "max_conns_per_ip", l.perIP)
		}
		return false
	}
	if l.byIP == nil {
		l.byIP = make(map[netip.Addr]int)
	}
	l.byIP[ip] = n + 1
	l.mu.Unlock()
	return true
}

func (l *Limiter) unreserveIPLocked(ip netip.Addr) {
	if n := l.byIP[ip] - 1; n > 0 {
		l.byIP[ip] = n
	} else {
		delete(l.byIP, ip)
	}
}

func (l *Limiter) unlinkLocked(c *clientConn) {
	if c.list == &l.parked {
		l.global.ClientParked(-1)
	}
	if c.list != nil {
		c.list.remove(c)
	}
}

func (l *Limiter) wakeLocked() {
	if l.wake != nil {
		close(l.wake)
		l.wake = nil
	}
}

// ConnState is fasthttp's Server.ConnState hook. StateNew needs nothing (the listener registered the
// connection as fresh) and neither does StateClosed (clientConn.Close released it).
func (l *Limiter) ConnState(nc net.Conn, st fasthttp.ConnState) {
	c := asClientConn(nc)
	if c == nil {
		return // served with ServeConn, not through the listener
	}
	switch st {
	case fasthttp.StateActive:
		c.activate()
	case fasthttp.StateIdle:
		l.mu.Lock()
		if c.state.Load() == connActive {
			c.state.Store(connIdle)
			c.since = time.Now()
			l.idle.pushBack(c)
			l.wakeLocked()
		}
		l.mu.Unlock()
	case fasthttp.StateHijacked:
		l.mu.Lock()
		if c.state.Load() != connClosed {
			l.unlinkLocked(c)
			c.state.Store(connHijacked)
		}
		l.mu.Unlock()
	}
}

// clientConn states.
const (
	connFresh int32 = iota
	connActive
	connIdle
	connReclaiming // chosen by admit; reclaim decides under mu
	connHijacked
	connClosed
)

// clientConn is an admitted client connection. It takes one unit of the socket budget, gives it back on the
// first Close, and tells the Limiter when a request begins.
type clientConn struct {
	net.Conn                 // as accepted: a *tls.Conn on a TLS listener
	raw      net.Conn        // the socket: Conn, or the one under TLS
	rc       syscall.RawConn // raw's, made once (the client watch asks for it on every request); nil if none
	l        *Limiter
	ip       netip.Addr // counted against max_conns_per_ip; zero when not

	state     atomic.Int32
	released  atomic.Bool
	lingering atomic.Bool // Close has decided whether to linger (linger)
	// lingerWanted is set (CloseAfter) when the server answers before having read the whole request.
	lingerWanted atomic.Bool
	// mu orders the reader's "a request began" (activate) against reclaim's look-then-close.
	mu sync.Mutex

	// Under l.mu.
	since      time.Time // accepted (fresh) or went idle
	prev, next *clientConn
	list       *connList

	// Read-ahead (see Read): ahead holds bytes taken from the socket and not yet read, ahead[aheadOff:aheadN];
	// it is pooled and held only until they are. readAhead is readAheadFD as a func value (made once, so a
	// read allocates nothing), nil where read-ahead is not possible (TLS); aheadErr is its error.
	ahead     *[aheadSize]byte
	aheadOff  int
	aheadN    int
	aheadErr  error
	readAhead func(fd uintptr) bool
	// The wait for a request head (see Read): waitHead is set for the read that waits for a request's first
	// byte, head holds the head's bytes read while the rest is awaited (what was received, not a buffer).
	waitHead bool
	head     []byte
	// headErr is what the read after the head's bytes returns (ErrBareLF, ErrNotRequest), nil if it reads the
	// socket.
	// inHead is set while a head read straight into fasthttp's buffer (watchHead) has not ended; headTail
	// holds its last bytes, for line ends split across reads.
	headErr   error
	inHead    bool
	headTail  [3]byte
	headTailN int

	// rd and wd arm the socket's deadlines coarsely (CoarseDeadline): fasthttp asks for a read deadline
	// twice per request.
	rd, wd CoarseDeadline

	// Parking (parkIdle). idleRead is set while the reader waits in the socket for the next request;
	// parkWanted once parkIdle has woken that wait, with idleDeadline (Unix ns, under mu) the read deadline
	// armed before; parkNow once Read has answered the woken wait with the end of the connection, which the
	// Close that follows turns into a park. inPark: a park goroutine owns the connection; reparked: the
	// connection it served was parked again rather than closed.
	idleRead     atomic.Bool
	parkWanted   atomic.Bool
	parkNow      atomic.Bool
	inPark       atomic.Bool
	reparked     atomic.Bool
	idleDeadline int64
}

func newClientConn(nc net.Conn, l *Limiter, ip netip.Addr, now time.Time) *clientConn {
	c := &clientConn{Conn: nc, raw: nc, l: l, ip: ip, since: now}
	if tc, ok := nc.(*tls.Conn); ok {
		c.raw = tc.NetConn()
	}
	if sc, ok := c.raw.(syscall.Conn); ok {
		c.rc, _ = sc.SyscallConn()
	}
	if c.rc != nil && c.raw == nc {
		c.readAhead = c.readAheadFD
	}
	return c
}

// aheadSize is the read-ahead buffer: a request's headers and a typical body in one read. Reads shorter than
// smallRead (fasthttp's one-byte wait for a request) read ahead.
const (
	aheadSize = 16 << 10
	smallRead = 512
)

var aheadPool = sync.Pool{New: func() any { return new([aheadSize]byte) }}

// netConn is c as handed to fasthttp.
func (c *clientConn) netConn() net.Conn {
	if tc, ok := c.Conn.(*tls.Conn); ok {
		return &clientTLSConn{clientConn: c, tc: tc}
	}
	return c
}

// Read marks the connection active when a request's first bytes arrive. If the listener reclaimed it in
// between, the bytes are dropped and the connection reads as closed, as if the close had come first.
//
// fasthttp (with ReduceMemoryUsage) waits for a connection's first request - and, on a parked connection,
// for the next - by reading one byte, then reads the rest into a buffer it takes only then: two reads of a
// request that is usually whole in the socket. A small read on a plain socket therefore reads ahead: into
// a pooled buffer, taken only for the system call, so a waiting connection still holds none; the bytes past
// what was asked for are handed out by the reads that follow, which then make no system call.
//
// The read of a request's first byte (fasthttp's, on a fresh or parked connection) returns only once the
// request's head is whole in what was read, or headMax bytes of it came, or the wait ended (a deadline, a
// close): fasthttp takes its read buffer (max_header_bytes, 64 KiB by default) when that byte comes and
// keeps it until the head is read, so that a client sending a head slowly - or the first bytes of one, and
// nothing more - would hold it for up to read_timeout_secs. The bytes read meanwhile are held as received.
//
// A head whose lines end in a bare LF has no CRLF CRLF for fasthttp to wait for: its bytes are handed over
// once its empty line came, and the read after them fails with ErrBareLF, which the server answers with 400
// at once instead of at read_timeout_secs. So do bytes that cannot begin a request line (ErrNotRequest).
//
// A read that waits for the next request on an idle connection can be woken by parkIdle: it then reads as
// the end of the connection, so that fasthttp lets go of the connection and its buffers.
func (c *clientConn) Read(b []byte) (int, error) {
	if c.ahead != nil {
		return c.readBuffered(b), nil
	}
	if err := c.headErr; err != nil {
		c.headErr = nil
		return 0, err
	}
	s := c.state.Load()
	idle := s == connIdle
	if idle {
		c.idleRead.Store(true)
	}
	var n int
	var err error
	if c.readAhead != nil && len(b) > 0 && len(b) < smallRead {
		c.waitHead = len(b) == 1 && (s == connFresh || idle)
		n, err = c.readAheadInto(b)
		c.waitHead = false
	} else {
		n, err = c.Conn.Read(b)
		if n > 0 && (s == connFresh || idle || c.inHead) {
			c.watchHead(b[:n])
		}
	}
	if idle {
		c.idleRead.Store(false)
		if n == 0 && c.parkWanted.Load() && errors.Is(err, os.ErrDeadlineExceeded) {
			c.parkNow.Store(true)
			return 0, io.EOF
		}
	}
	if n > 0 {
		if s := c.state.Load(); s != connActive && s != connHijacked && !c.activate() {
			c.dropAhead()
			return 0, net.ErrClosed
		}
	}
	return n, err
}

// readAheadInto reads what the socket holds (waiting for it if nothing does) into a pooled buffer and
// copies the start into b.
func (c *clientConn) readAheadInto(b []byte) (int, error) {
	c.aheadErr = nil
	if err := c.rc.Read(c.readAhead); err != nil {
		if len(c.head) == 0 {
			// Deadline, close: the plain read reports it as it always has.
			return c.Conn.Read(b)
		}
		// The wait for the rest of a head ended: what came of it is read, and the read that follows meets
		// the deadline or the close.
		c.aheadHead(aheadPool.Get().(*[aheadSize]byte))
	}
	if c.aheadErr != nil {
		if c.aheadErr == io.EOF {
			return 0, io.EOF
		}
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("read", c.aheadErr)}
	}
	return c.readBuffered(b), nil
}

// readAheadFD is the RawConn callback of readAheadInto: one non-blocking read, the buffer taken only
// while bytes come. When waitHead is set and they are not a whole request head, they are kept in head and
// it waits for the rest (headWaits).
func (c *clientConn) readAheadFD(fd uintptr) bool {
	buf := aheadPool.Get().(*[aheadSize]byte)
	for {
		n, err := syscall.Read(int(fd), buf[:aheadSize-len(c.head)])
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			aheadPool.Put(buf)
			return false // wait until readable, then call again
		case err != nil || n == 0:
			if len(c.head) > 0 {
				// The head's bytes are read first; the read after them meets the end or the error again.
				return c.aheadHead(buf)
			}
			c.aheadErr = io.EOF
			if err != nil {
				c.aheadErr = err
			}
			aheadPool.Put(buf)
			return true
		case len(c.head) == 0 && !(c.waitHead && c.headWaits(buf[:n], 0)):
			c.ahead, c.aheadOff, c.aheadN = buf, 0, n
			return true
		}
		from := len(c.head)
		c.head = append(c.head, buf[:n]...)
		if from == 0 || c.headWaits(c.head, from) { // a first read got here because its head waits
			aheadPool.Put(buf)
			return false // wait for the rest of the head
		}
		return c.aheadHead(buf)
	}
}

// headMax is how much of a request head the wait for its end holds: aheadSize, or less when
// server.max_header_bytes is (the server then refuses the head at once).
func (c *clientConn) headMax() int {
	if m := c.l.headMax; m > 0 && m < aheadSize {
		return m
	}
	return aheadSize
}

// aheadHead makes the bytes in head the read-ahead, in buf.
func (c *clientConn) aheadHead(buf *[aheadSize]byte) bool {
	c.ahead, c.aheadOff, c.aheadN = buf, 0, copy(buf[:], c.head)
	c.head = nil
	return true
}

// headWaits reports whether the wait for the head in b, what came of a request so far (b[:from] looked at
// before), goes on: its empty line did not come, nor headMax bytes of it. A head that ends in a bare LF's
// empty line, or bytes that cannot begin a request line, end the wait with headErr set.
func (c *clientConn) headWaits(b []byte, from int) bool {
	ended, bare := headLines(b[max(from-3, 0):]) // a CRLF CRLF split between reads starts at most 3 bytes back
	switch {
	case ended || len(b) >= c.headMax():
		return false
	case bare:
		c.headErr = ErrBareLF
		return false
	case notRequestLine(b):
		c.headErr = ErrNotRequest
		return false
	}
	return true
}

// ErrBareLF is the error of the read after a request head whose lines end in a bare LF (see Read).
// RFC 9112 section 2.2 lets a server refuse them; a gateway that forwards the request refuses them rather
// than guess where a line ends differently from what sits in front of it.
var ErrBareLF = errors.New("request head lines end in a bare LF; HTTP/1.1 requires CRLF")

// ErrNotRequest is the error of the read after bytes that cannot begin a request line (see Read): a TLS
// handshake sent to a plain-HTTP port, say. fasthttp would wait for their end of line, or CRLF CRLF.
var ErrNotRequest = errors.New("the bytes received do not begin an HTTP request line")

// notRequestLine reports whether b, the start of what came for a request, cannot begin a request line: a
// byte that is no token character comes before the method's space. Empty lines before it are skipped, as
// fasthttp skips them.
func notRequestLine(b []byte) bool {
	for len(b) > 0 && (b[0] == '\r' || b[0] == '\n') {
		b = b[1:]
	}
	for i, c := range b {
		if c == ' ' {
			return i == 0
		}
		if !tokenChars[c] {
			return true
		}
	}
	return false
}

// watchHead looks at p, the bytes of a request head read straight into fasthttp's buffer: the next request
// on a keep-alive connection (fasthttp keeps its buffer between requests with streamed bodies), or any
// request over TLS. The watch ends at the head's CRLF CRLF; at an empty line ended by a bare LF, or at a first
// read that cannot begin a request line, the next read fails (ErrBareLF, ErrNotRequest).
func (c *clientConn) watchHead(p []byte) {
	first := !c.inHead
	if first {
		c.headTailN = 0 // a new head: what ended the last one is no line end of this one
	}
	c.inHead = false
	ended, bare := headLines(p)
	if c.headTailN > 0 && !ended {
		var edge [6]byte // the end of what came before and the start of p: a line end split between reads
		endedE, bareE := headLines(append(append(edge[:0], c.headTail[:c.headTailN]...), p[:min(len(p), 3)]...))
		ended, bare = ended || endedE, bare || bareE
	}
	switch {
	case ended:
		return
	case bare:
		c.headErr = ErrBareLF
		return
	case first && notRequestLine(p):
		c.headErr = ErrNotRequest
		return
	}
	c.inHead = true
	// Keep the last bytes of what came, p's or, when p is shorter, the previous tail's too.
	var all [6]byte
	t := append(append(all[:0], c.headTail[:c.headTailN]...), p[max(len(p)-len(c.headTail), 0):]...)
	c.headTailN = copy(c.headTail[:], t[max(len(t)-len(c.headTail), 0):])
}

// headLines walks the line ends of b, a head or a piece of one: ended when b holds a CRLF CRLF - the only end
// of a head fasthttp takes; the walk stops there - and bare when an empty line before it is ended by a bare
// LF (LF LF, or LF CRLF after a line ended by a bare LF). One IndexByte per line: it looks at every request's
// head (headWaits, watchHead).
func headLines(b []byte) (ended, bare bool) {
	for i := 0; ; {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return false, bare
		}
		i += j + 1
		switch rest := b[i:]; {
		case len(rest) >= 2 && rest[0] == '\r' && rest[1] == '\n':
			if i >= 2 && b[i-2] == '\r' {
				return true, false
			}
			bare = true
		case len(rest) >= 1 && rest[0] == '\n':
			bare = true
		}
	}
}

// readBuffered hands out read-ahead bytes, and returns the buffer to the pool once they are all read.
func (c *clientConn) readBuffered(b []byte) int {
	n := copy(b, c.ahead[c.aheadOff:c.aheadN])
	c.aheadOff += n
	if c.aheadOff == c.aheadN {
		c.dropAhead()
	}
	return n
}

func (c *clientConn) dropAhead() {
	if c.ahead != nil {
		aheadPool.Put(c.ahead)
		c.ahead = nil
	}
}

// SetReadDeadline arms the read deadline, up to 1/deadlineSlack of the timeout late (CoarseDeadline).
func (c *clientConn) SetReadDeadline(t time.Time) error { return c.rd.Set(t, c.Conn.SetReadDeadline) }

// SetWriteDeadline arms the write deadline, up to 1/deadlineSlack of the timeout late (CoarseDeadline).
func (c *clientConn) SetWriteDeadline(t time.Time) error { return c.wd.Set(t, c.Conn.SetWriteDeadline) }

// SetDeadline arms both deadlines exactly.
func (c *clientConn) SetDeadline(t time.Time) error {
	err := c.Conn.SetDeadline(t)
	c.rd.Forget(t)
	c.wd.Forget(t)
	return err
}

// activate marks c active. It reports false if c was reclaimed (or closed) first.
func (c *clientConn) activate() bool {
	switch c.state.Load() {
	case connActive, connHijacked:
		return true
	}
	c.mu.Lock()
	if c.parkWanted.Swap(false) {
		// The request came as parkIdle woke the wait for it: put back the deadline it moved.
		c.restoreReadDeadline()
	}
	l := c.l
	l.mu.Lock()
	switch c.state.Load() {
	case connFresh, connIdle:
		l.unlinkLocked(c)
		c.state.Store(connActive)
	case connReclaiming:
		c.state.Store(connActive) // admit unlinked it; reclaim will see it active
	}
	ok := c.state.Load() != connClosed
	l.mu.Unlock()
	c.mu.Unlock()
	return ok
}

// Close closes the connection and returns its place, per-address count and budget unit, once. The server
// closing a connection in the middle of a request - it answered before having read all of it (CloseAfter),
// or request bytes wait unread - lingers (linger) rather than closing at once.
//
// The Close that follows a read woken by parkIdle parks the connection instead (park).
func (c *clientConn) Close() error {
	if c.parkNow.CompareAndSwap(true, false) {
		if c.inPark.Load() {
			c.reparked.Store(true) // its park goroutine waits for the next request again
		} else if c.l.addParker() {
			c.inPark.Store(true)
			go c.park()
		} else {
			return c.closeNow() // shutting down
		}
		c.l.parks.Add(1)
		return nil
	}
	if c.state.Load() == connActive && c.lingering.CompareAndSwap(false, true) && (c.lingerWanted.Load() || c.pending()) {
		if tc, ok := c.raw.(*net.TCPConn); ok {
			go c.linger(tc)
			return nil
		}
	}
	return c.closeNow()
}

// closeNow closes the connection and gives back its place.
func (c *clientConn) closeNow() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// CloseAfter answers with Connection: close, and makes that close linger: the answer comes before the whole
// request was read (a 413 over max_body_bytes, a 431 over max_header_bytes, a timeout, a refused header).
func CloseAfter(ctx *fasthttp.RequestCtx) {
	ctx.SetConnectionClose()
	if c := asClientConn(ctx.Conn()); c != nil {
		c.lingerWanted.Store(true)
	}
}

// asClientConn returns the clientConn fasthttp serves as nc (plain or under TLS), or nil for a connection
// that did not come through the listener.
func asClientConn(nc net.Conn) *clientConn {
	switch x := nc.(type) {
	case *clientConn:
		return x
	case *clientTLSConn:
		return x.clientConn
	}
	return nil
}

// Parking. fasthttp keeps a connection's read buffer (max_header_bytes, 64 KiB by default) from one
// request to the next when it streams request bodies, as the gateway has it do: ReduceMemoryUsage gives the
// buffer back between requests only for bodies read whole. A keep-alive connection would hold it all the
// time it idles, so that clients' idle pools, or a client opening max_conns connections and sending one
// small request on each, would hold max_conns times that. So a connection idle for parkAfter is parked:
// parkIdle wakes the read that waits for its next request (a deadline in the past), the read answers as
// the end of the connection, and fasthttp ends serving it and gives back its buffers and request context;
// the Close that follows does not close it but starts park, a goroutine that waits for the next request
// holding no buffer - the goroutine is what an idle connection cost already - and hands the connection to
// the server's ServeConn again when it comes. A parked connection keeps its place, stays idle for max_conns
// (reclaimed like any idle one), and is closed at the idle timeout, and at shutdown.

// ParkIdle parks the connections idle for parkAfter or longer. The gateway's janitor calls it.
func (l *Limiter) ParkIdle(now time.Time) {
	if l.serve == nil {
		return
	}
	cut := now.Add(-l.parkAfter)
	var batch []*clientConn
	l.mu.Lock()
	for c := l.idle.head; c != nil && !c.since.After(cut); c = c.next {
		batch = append(batch, c)
	}
	l.mu.Unlock()
	for _, c := range batch {
		c.wakeToPark()
	}
}

// wakeToPark wakes c's reader if it waits in the socket for the next request; Read then ends it (see
// Parking). A reader not waiting there is left alone: it is about to, and parkIdle comes again.
func (c *clientConn) wakeToPark() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rc == nil || c.state.Load() != connIdle || !c.idleRead.Load() || c.parkWanted.Load() {
		return
	}
	c.idleDeadline = c.rd.armed.Load()
	c.parkWanted.Store(true)
	c.forceReadDeadline(time.Unix(1, 0))
}

// restoreReadDeadline arms again the read deadline wakeToPark replaced. Under c.mu.
func (c *clientConn) restoreReadDeadline() {
	var t time.Time
	if c.idleDeadline != 0 {
		t = time.Unix(0, c.idleDeadline)
	}
	c.forceReadDeadline(t)
}

// forceReadDeadline arms t whatever the read deadline is recorded as (CoarseDeadline).
func (c *clientConn) forceReadDeadline(t time.Time) {
	_ = c.Conn.SetReadDeadline(t)
	c.rd.Forget(t)
}

// addParker counts a park goroutine about to start; false once shutdown began.
func (l *Limiter) addParker() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closing {
		return false
	}
	l.parkers.Add(1)
	return true
}

// park owns a connection fasthttp let go of between requests: it waits for the next request and serves the
// connection again, until the connection closes.
func (c *clientConn) park() {
	defer c.l.parkers.Done()
	for c.awaitRequest() {
		c.reparked.Store(false)
		_ = c.l.serve(c.netConn())
		if !c.reparked.Load() {
			return // served to its end: ServeConn closed it
		}
	}
	_ = c.closeNow()
}

// awaitRequest waits, holding no buffer, until the next request's first bytes can be read. It reports false
// if the connection is to be closed instead: the client closed it, the idle timeout passed, it was
// reclaimed, or the gateway is shutting down.
func (c *clientConn) awaitRequest() bool {
	l := c.l
	c.mu.Lock()
	l.mu.Lock()
	if l.closing || c.state.Load() == connClosed {
		l.mu.Unlock()
		c.mu.Unlock()
		return false
	}
	if c.state.Load() == connIdle {
		l.unlinkLocked(c)
		l.parked.pushBack(c)
		l.global.ClientParked(1)
	}
	l.mu.Unlock()
	if c.parkWanted.Swap(false) {
		c.restoreReadDeadline()
	}
	c.mu.Unlock()
	if c.ahead == nil && PeekSocket(c.rc) != PeekData {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.closing
}

// CloseParked begins shutdown for parked connections: each is closed, and none is parked or served again.
func (l *Limiter) CloseParked() {
	l.mu.Lock()
	l.closing = true
	var cs []*clientConn
	for c := l.parked.head; c != nil; c = c.next {
		cs = append(cs, c)
	}
	l.mu.Unlock()
	for _, c := range cs {
		_ = c.raw.Close() // wakes its park goroutine, which releases it
	}
}

// Lingering close. The server closes a connection while serving a request when it answers before having
// read the whole request. The client may still be sending, and a socket closed with unread bytes sends a reset:
// the client's next write fails with "connection reset" or "broken pipe", and its kernel may drop the
// answer it had received but not yet handed over - the client never sees why it was refused. So such a
// close first ends the sending side (a FIN right after the answer, which tells a client that reads to the
// end that the answer is whole), then reads and drops what comes until the client closes too, lingerGap
// passes without a byte or lingerRounds times that in all, and only then closes, as nginx's lingering_close
// does (lingering_timeout, lingering_time). The connection keeps its place under max_conns meanwhile; a
// second Close (shutdown) ends the linger at once.
const (
	lingerGap    = 2 * time.Second
	lingerRounds = 5
)

func (c *clientConn) linger(tc *net.TCPConn) {
	defer c.closeNow()
	if t, ok := c.Conn.(*tls.Conn); ok {
		_ = t.SetWriteDeadline(time.Now().Add(c.l.linger))
		_ = t.CloseWrite() // close_notify, when the handshake is done
	}
	if tc.CloseWrite() != nil {
		return
	}
	var buf [4 << 10]byte
	gap := c.l.linger
	end := time.Now().Add(lingerRounds * gap)
	for {
		now := time.Now()
		if !now.Before(end) {
			return
		}
		d := now.Add(gap)
		if d.After(end) {
			d = end
		}
		if tc.SetReadDeadline(d) != nil {
			return
		}
		if _, err := tc.Read(buf[:]); err != nil {
			return
		}
	}
}

// release returns c's place under max_conns, its per-address count and its budget unit. Only the first call
// does; it reports whether this was it.
func (c *clientConn) release() bool {
	if !c.released.CompareAndSwap(false, true) {
		return false
	}
	l := c.l
	l.mu.Lock()
	l.unlinkLocked(c)
	c.state.Store(connClosed)
	l.open--
	if c.ip.IsValid() {
		l.unreserveIPLocked(c.ip)
	}
	l.wakeLocked()
	l.mu.Unlock()
	l.budget.Put()
	l.global.ClientConns(-1)
	return true
}

var errNotSocket = errors.New("the connection is not a socket")

// SyscallConn returns the socket's raw connection (under TLS too), so that the client watch can peek at it
// (RawConn).
func (c *clientConn) SyscallConn() (syscall.RawConn, error) {
	if c.rc == nil {
		return nil, errNotSocket
	}
	return c.rc, nil
}

// pending reports whether bytes wait unread in the socket: a request on its way to the reader.
func (c *clientConn) pending() bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	data := false
	_ = rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		data = err == nil && n > 0
	})
	return data
}

// freshAge is how long a fresh connection has been quiet: since the kernel last received data on it (for a
// plain connection: since its handshake, backlog time included; for TLS: since the last handshake bytes), or
// since it was accepted where the kernel does not say.
func (c *clientConn) freshAge(now time.Time) time.Duration {
	if d, ok := tcpQuiet(c.raw); ok {
		return d
	}
	return now.Sub(c.since)
}

// linuxTCPInfo is TCP_INFO in include/uapi/linux/tcp.h (syscall.TCP_INFO exists on Linux only).
const linuxTCPInfo = 11

// tcpQuiet returns tcpi_last_data_recv of Linux's struct tcp_info: the time since the socket last received
// data, or since the connection was created if it never has ("tcp: initialize icsk_ack.lrcvtime at session
// start time", Linux 4.11; older kernels report more, which only makes fresh connections reclaimable
// sooner). ok is false on other systems and for non-TCP connections.
func tcpQuiet(nc net.Conn) (d time.Duration, ok bool) {
	if runtime.GOOS != "linux" {
		return 0, false
	}
	sc, isSock := nc.(syscall.Conn)
	if !isSock {
		return 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	_ = rc.Control(func(fd uintptr) {
		var info [64]byte // through tcpi_last_ack_recv; the kernel copies what fits
		n := uint32(len(info))
		_, _, errno := syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.IPPROTO_TCP, linuxTCPInfo,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&n)), 0)
		if errno == 0 && n >= 56 {
			d, ok = time.Duration(binary.NativeEndian.Uint32(info[52:56]))*time.Millisecond, true
		}
	})
	return d, ok
}

func remoteIP(nc net.Conn) netip.Addr {
	if a, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}

// clientTLSConn is a clientConn over a *tls.Conn. It has the methods fasthttp looks for to tell a TLS
// connection (RequestCtx.IsTLS, TLSConnectionState, ALPN), and NetConn as *tls.Conn has.
type clientTLSConn struct {
	*clientConn
	tc *tls.Conn
}

func (c *clientTLSConn) Handshake() error                     { return c.tc.Handshake() }
func (c *clientTLSConn) ConnectionState() tls.ConnectionState { return c.tc.ConnectionState() }
func (c *clientTLSConn) NetConn() net.Conn                    { return c.raw }

// connList is an intrusive list of clientConns, oldest first. Guarded by Limiter.mu.
type connList struct {
	head, tail *clientConn
	n          int
}

func (q *connList) pushBack(c *clientConn) {
	c.list, c.prev, c.next = q, q.tail, nil
	if q.tail != nil {
		q.tail.next = c
	} else {
		q.head = c
	}
	q.tail = c
	q.n++
}

func (q *connList) remove(c *clientConn) {
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		q.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		q.tail = c.prev
	}
	c.list, c.prev, c.next = nil, nil, nil
	q.n--
}

// limitListener is the listener Gateway.Serve hands fasthttp. Accept never returns an error fasthttp would
// stop serving on: failed accepts (EMFILE, ENFILE, ENOBUFS, ENOMEM, ECONNABORTED, timeouts, and any other
// error) are retried with a backoff of 5 ms doubling to 1 s, logged at most once a second with a count. It
// returns only when the listener is closed. Accepted connections go through Limiter.admit.
//
// Accept calls are serialized; Close may be called at any time and wakes a waiting Accept.
type limitListener struct {
	net.Listener
	l    *Limiter
	done chan struct{}
	once sync.Once

	mu      sync.Mutex // held through Accept
	delay   time.Duration
	errs    int // since the last log
	lastLog time.Time
}

func (ln *limitListener) Accept() (net.Conn, error) {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	for {
		nc, err := ln.Listener.Accept()
		if err != nil {
			if ln.closed() || closedErr(err) {
				return nil, err
			}
			if !ln.backoff(err) {
				return nil, ln.errClosed()
			}
			continue
		}
		ln.delay = 0
		if c := ln.l.admit(nc, ln.done); c != nil {
			return c.netConn(), nil
		}
		if ln.closed() {
			return nil, ln.errClosed()
		}
	}
}

// backoff counts and logs a failed accept and sleeps before the next. It reports false if the listener was
// closed meanwhile.
func (ln *limitListener) backoff(err error) bool {
	ln.l.acceptErrors.Add(1)
	ln.l.global.AcceptError()
	ln.delay = min(max(2*ln.delay, acceptBackoffMin), acceptBackoffMax)
	ln.errs++
	if now := time.Now(); now.Sub(ln.lastLog) >= time.Second {
		ln.l.log.Warn("cannot accept connections; retrying", "addr", ln.Addr().String(), "err", err,
			"errors", ln.errs, "backoff", ln.delay.String())
		ln.errs, ln.lastLog = 0, now
	}
	return sleep(nil, ln.delay, ln.done)
}

// Close closes the listener and wakes an Accept waiting at the cap or in backoff.
func (ln *limitListener) Close() error {
	ln.once.Do(func() { close(ln.done) })
	return ln.Listener.Close()
}

func (ln *limitListener) closed() bool {
	select {
	case <-ln.done:
		return true
	default:
		return false
	}
}

func (ln *limitListener) errClosed() error {
	// fasthttp's Serve returns nil on an error saying "use of closed network connection".
	return &net.OpError{Op: "accept", Net: ln.Addr().Network(), Addr: ln.Addr(), Err: net.ErrClosed}
}

// closedErr reports whether err means the listener is closed: net.ErrClosed, or the same text from
// listeners that do not wrap it (fasthttputil.InmemoryListener).
func closedErr(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) ||
		strings.Contains(err.Error(), "use of closed network connection")
}
