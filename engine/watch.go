package engine

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rolter-ai/rolter/clientconn"
)

// clientWatch notices a client that goes away while the gateway works on its request - waiting in an
// admission queue, or waiting on the upstream - and then closes the upstream connection so the engine stops
// generating (fasthttp has no per-request cancellation: RequestCtx.Done only fires at server shutdown,
// fasthttp issues #874 and #993).
//
// It arms a timer; if the request is still in progress when it fires, a goroutine waits for the client
// socket to become readable and peeks at it (MSG_PEEK, so nothing is consumed from the server's view of the
// connection). An error means the client reset: it is gone. Readable data (a pipelined request) means it is
// alive and the watch ends. A read of 0 bytes is a FIN, and a FIN alone does not tell a client that left
// from one that only closed its sending side and still waits for the answer (`nc -N`, and proxies that
// forward half-closes). So, before the response has started and for HTTP/1.1 clients only, the watcher
// writes one interim "100 Continue" response - every HTTP/1.1 client must accept and skip interim responses
// (RFC 9110 section 15.2) - and watches for the reset that a departed client's kernel answers it with. A
// half-closed client reads the interim response and gets its answer later. (After a FIN, recv reports 0
// bytes even once the reset came, so the watcher reads the TCP state instead: see tcpClosed.) HTTP/1.0 clients cannot be sent
// interim responses, and once the response has started nothing may be written beside it: a FIN then ends
// the watch, and a departed client is noticed when a write to it fails.
//
// Fast requests finish before the timer fires and never start a goroutine.
//
// One clientWatch belongs to one pooled call; arm, setVictim, startResponse and disarm are called by the
// request's goroutine only.
type clientWatch struct {
	timer *time.Timer
	conn  net.Conn
	rc    syscall.RawConn
	state atomic.Int32
	done  chan struct{} // the watcher goroutine has let go of the connection
	stop  chan struct{} // disarm asks a watcher waiting between probe checks to end
	gone  atomic.Bool
	// goneC receives once when the client is seen leaving; it wakes a request waiting for admission.
	goneC chan struct{}
	// victim is the upstream connection to close when the client goes away.
	victim atomic.Pointer[uconn]

	canProbe   bool       // HTTP/1.1 client: an interim response may be written
	probeMu    sync.Mutex // orders the probe write against the start of the response
	responding bool       // under probeMu: the response has started; nothing may be written beside it
}

const (
	watchIdle int32 = iota
	watchArmed
	watchRunning
)

// armed past this delay: requests answered faster never pay for a goroutine.
const defaultWatchDelay = 50 * time.Millisecond

// probeInterim is written to a client that sent a FIN, to tell a departure from a half-close.
var probeInterim = []byte("HTTP/1.1 100 Continue\r\n\r\n")

// probeChecks are the waits between looks for the reset that answers the probe: a reset comes back within
// a round trip, so the first looks are quick; after them the watcher looks once a second.
var probeChecks = [...]time.Duration{2 * time.Millisecond, 10 * time.Millisecond, 50 * time.Millisecond, 250 * time.Millisecond}

// arm starts watching conn after delay. victim may be nil (set later with setVictim); http11 says whether an
// interim response may be written to the client. It is a no-op for connections without a raw socket
// (in-memory listeners in tests and benchmarks).
func (w *clientWatch) arm(conn net.Conn, delay time.Duration, victim *uconn, http11 bool) {
	w.gone.Store(false)
	w.victim.Store(victim)
	if w.state.Load() != watchIdle {
		return
	}
	rc := clientconn.RawConn(conn)
	if rc == nil {
		return
	}
	w.conn, w.rc = conn, rc
	w.canProbe = http11
	w.responding = false
	if w.done == nil {
		w.done = make(chan struct{}, 1)
		w.stop = make(chan struct{}, 1)
		w.goneC = make(chan struct{}, 1)
		w.timer = time.AfterFunc(time.Hour, w.run)
		w.timer.Stop()
	}
	select {
	case <-w.stop:
	default:
	}
	select {
	case <-w.goneC:
	default:
	}
	w.state.Store(watchArmed)
	w.timer.Reset(delay)
}

// setVictim points the watch at the upstream connection of the current attempt (nil between attempts). It
// reports whether the client is already gone, in which case the caller must not use the connection.
func (w *clientWatch) setVictim(v *uconn) bool {
	w.victim.Store(v)
	return w.gone.Load()
}

// startResponse is called before the handler hands the server a response that streams after it returns:
// from then on the watcher only looks, it never writes.
func (w *clientWatch) startResponse() {
	w.probeMu.Lock()
	w.responding = true
	w.probeMu.Unlock()
}

// left returns a channel that receives when the client is seen leaving, or nil when nothing watches.
func (w *clientWatch) left() <-chan struct{} {
	if w.state.Load() == watchIdle {
		return nil
	}
	return w.goneC
}

// closed reports whether the client's connection is gone (reset, or torn down by the kernel).
func (w *clientWatch) closed() bool {
	closed := false
	err := w.rc.Control(func(fd uintptr) { closed = tcpClosed(fd) })
	return err == nil && closed
}

func (w *clientWatch) run() {
	if !w.state.CompareAndSwap(watchArmed, watchRunning) {
		return
	}
	defer func() { w.done <- struct{}{} }()
	switch clientconn.PeekSocket(w.rc) {
	case clientconn.PeekReset:
		w.leave()
	case clientconn.PeekEOF:
		if !w.canProbe {
			return
		}
		w.probeMu.Lock()
		if w.responding {
			w.probeMu.Unlock()
			return
		}
		_, err := w.conn.Write(probeInterim)
		w.probeMu.Unlock()
		if err != nil {
			w.leave()
			return
		}
		t := time.NewTimer(probeChecks[0])
		defer t.Stop()
		for i := 1; ; i++ {
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
			if w.closed() {
				w.leave()
				return
			}
			d := time.Second
			if i < len(probeChecks) {
				d = probeChecks[i]
			}
			t.Reset(d)
		}
	}
}

// leave records that the client went away and closes the upstream connection working for it.
func (w *clientWatch) leave() {
	w.gone.Store(true)
	if v := w.victim.Load(); v != nil {
		v.close()
	}
	select {
	case w.goneC <- struct{}{}:
	default:
	}
}

// disarm stops watching and waits for the watcher goroutine to let go of the connection, so the server
// can use it again. It reports whether the client was seen leaving. It may be called more than once.
func (w *clientWatch) disarm() bool {
	w.victim.Store(nil)
	switch {
	case w.state.CompareAndSwap(watchArmed, watchIdle):
		w.timer.Stop()
	case w.state.Load() == watchRunning:
		// Wake a parked Read with a deadline in the past, or a watcher between probe checks, then clear the
		// deadline. The server sets its own read deadline again before it reads the next request.
		select {
		case w.stop <- struct{}{}:
		default:
		}
		_ = w.conn.SetReadDeadline(time.Unix(1, 0))
		<-w.done
		_ = w.conn.SetReadDeadline(time.Time{})
		w.state.Store(watchIdle)
	}
	w.conn, w.rc = nil, nil
	return w.gone.Load()
}
