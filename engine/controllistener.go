package engine

import (
	"net"

	"github.com/rolter-ai/rolter/clientconn"
)

// ControlListener wraps ln, the control plane's listener, so that it holds at most [control] max_conns
// connections (clientconn.CapListener). The cap was taken out of the gateway's socket budget when the
// gateway was created (connLimits); with the control plane disabled in the config the gateway started
// with, the cap is 1: nothing was set aside for it.
func (g *Gateway) ControlListener(ln net.Listener) net.Listener {
	return clientconn.CapListener(ln, max(g.control, 1), g.global)
}
