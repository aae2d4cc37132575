package clientconn

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"
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
