package engine

import (
	"net"
	"sync"
	"sync/atomic"

	"github.com/rolter-ai/rolter/telemetry"
)

// ControlListener wraps ln, the control plane's listener, so that it holds at most [control] max_conns
// connections: one accepted beyond the cap is closed at once and counted
// (rolter_control_connections_rejected_total). The cap was taken out of the gateway's socket budget when
// the gateway was created (connLimits), so connections to the control plane - idle ones included - never
// take descriptors the data plane counts on. With the control plane disabled in the config the gateway
// started with, the cap is 1: nothing was set aside for it.
func (g *Gateway) ControlListener(ln net.Listener) net.Listener {
	return &controlListener{Listener: ln, max: int64(max(g.control, 1)), global: g.global}
}

// controlListener is ControlListener's. Safe for concurrent use.
type controlListener struct {
	net.Listener
	max    int64
	global *telemetry.Global
	open   atomic.Int64
}

// Accept returns the next connection that fits under the cap, closing those that do not; errors are ln's
// (http.Server retries the temporary ones, EMFILE among them, with a backoff).
func (l *controlListener) Accept() (net.Conn, error) {
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
		return &controlConn{Conn: nc, l: l}, nil
	}
}

// controlConn is an admitted control-plane connection: its place under the cap is given back on the first
// Close.
type controlConn struct {
	net.Conn
	l    *controlListener
	once sync.Once
}

func (c *controlConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.open.Add(-1)
		c.l.global.ControlConns(-1)
	})
	return err
}
