package clientconn

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"
)

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

// clientTLSConn is a clientConn over a *tls.Conn. It has the methods fasthttp looks for to tell a TLS
// connection (RequestCtx.IsTLS, TLSConnectionState, ALPN), and NetConn as *tls.Conn has.
type clientTLSConn struct {
	*clientConn
	tc *tls.Conn
}

func (c *clientTLSConn) Handshake() error                     { return c.tc.Handshake() }
func (c *clientTLSConn) ConnectionState() tls.ConnectionState { return c.tc.ConnectionState() }
func (c *clientTLSConn) NetConn() net.Conn                    { return c.raw }
