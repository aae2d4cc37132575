package clientconn

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/telemetry"
)

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

func remoteIP(nc net.Conn) netip.Addr {
	if a, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}

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
