package clientconn

import (
	"time"
)

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
