package engine

import (
	"crypto/tls"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// clientWatch notices a client that closes its connection while the gateway waits on the upstream, and
// then closes the upstream connection so the engine stops generating (fasthttp has no per-request
// cancellation: RequestCtx.Done only fires at server shutdown, fasthttp issues #874 and #993).
//
// It arms a timer; if the request is still in progress when it fires, a goroutine waits for the client
// socket to become readable and peeks at it (MSG_PEEK, so nothing is consumed from the server's view of
// the connection): 0 bytes means the client sent FIN, an error means it reset; either way the client is
// gone. Readable data (a pipelined request) means the client is alive and the watch ends. Fast requests
// finish before the timer fires and never start a goroutine.
//
// One clientWatch belongs to one pooled call; arm and disarm are called by the request's goroutine only.
type clientWatch struct {
	timer *time.Timer
	conn  net.Conn
	rc    syscall.RawConn
	state atomic.Int32
	done  chan struct{}
	gone  atomic.Bool
	// victim is the upstream connection to close when the client goes away.
	victim atomic.Pointer[uconn]
}

const (
	watchIdle int32 = iota
	watchArmed
	watchRunning
)

// armed past this delay: requests answered faster never pay for a goroutine.
const defaultWatchDelay = 50 * time.Millisecond

// arm starts watching conn after delay. It is a no-op for connections without a raw socket (in-memory
// listeners in tests and benchmarks).
func (w *clientWatch) arm(conn net.Conn, delay time.Duration, victim *uconn) {
	w.gone.Store(false)
	w.victim.Store(victim)
	if w.state.Load() != watchIdle {
		return // already watching (a retry re-arms with a new victim)
	}
	rc := rawConn(conn)
	if rc == nil {
		return
	}
	w.conn, w.rc = conn, rc
	if w.done == nil {
		w.done = make(chan struct{}, 1)
		w.timer = time.AfterFunc(time.Hour, w.run)
		w.timer.Stop()
	}
	w.state.Store(watchArmed)
	w.timer.Reset(delay)
}

func (w *clientWatch) run() {
	if !w.state.CompareAndSwap(watchArmed, watchRunning) {
		return
	}
	var buf [1]byte
	gone := false
	err := w.rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == syscall.EAGAIN || err == syscall.EINTR:
			return false // not readable yet: park until it is
		case err != nil || n == 0:
			gone = true
		}
		return true
	})
	if err == nil && gone {
		w.gone.Store(true)
		if v := w.victim.Load(); v != nil {
			v.close()
		}
	}
	w.done <- struct{}{}
}

// disarm stops watching and waits for the watcher goroutine to let go of the connection, so the server
// can use it again. It reports whether the client was seen leaving.
func (w *clientWatch) disarm() bool {
	w.victim.Store(nil)
	switch {
	case w.state.CompareAndSwap(watchArmed, watchIdle):
		w.timer.Stop()
	case w.state.Load() == watchRunning:
		// Wake the parked Read with a deadline in the past, then clear it. The server sets its own read
		// deadline again before it reads the next request.
		_ = w.conn.SetReadDeadline(time.Unix(1, 0))
		<-w.done
		_ = w.conn.SetReadDeadline(time.Time{})
		w.state.Store(watchIdle)
	}
	w.conn, w.rc = nil, nil
	return w.gone.Load()
}

func rawConn(c net.Conn) syscall.RawConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}
