package clientconn

import (
	"net"
	"sync"
	"sync/atomic"

	"github.com/rolter-ai/rolter/telemetry"
)

// CapListener wraps ln so that it holds at most max connections: one accepted beyond the cap is closed at
// once and counted (rolter_control_connections_rejected_total). The control plane's listener is one: its
// cap is taken out of the socket budget the data plane counts on (Budget), so connections to it - idle
// ones included - never take descriptors the data plane's listener was promised.
func CapListener(ln net.Listener, max int, m *telemetry.Global) net.Listener {
	return &capListener{Listener: ln, max: int64(max), global: m}
}

// capListener is CapListener's. Safe for concurrent use.
type capListener struct {
	net.Listener
	max    int64
	global *telemetry.Global
	open   atomic.Int64
}

// Accept returns the next connection that fits under the cap, closing those that do not; errors are ln's
// (http.Server retries the temporary ones, EMFILE among them, with a backoff).
func (l *capListener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			_ = nc.Close()
			l.global.ControlRejected()
			continue
		}
		l.global.ControlConns(1)
		return &cappedConn{Conn: nc, l: l}, nil
	}
}

// cappedConn is an admitted connection: its place under the cap is given back on the first
// Close.
type cappedConn struct {
	net.Conn
	l    *capListener
	once sync.Once
}

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.open.Add(-1)
		c.l.global.ControlConns(-1)
	})
	return err
}
