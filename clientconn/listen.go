package clientconn

import (
	"context"
	"net"
)

// Client connections get TCP keepalive as Go's defaults set it: the first probe after 15 s of silence, then
// every 15 s, 9 in all. It tells a client that vanished during a long generation (no FIN, no reset) from
// one that is still waiting, and the client watch then sees the connection fail.
const (
	keepAliveSecs   = 15
	keepAliveProbes = 9
)

// Listen opens the gateway's TCP listener on addr (host:port).
func Listen(addr string) (net.Listener, error) {
	lc := listenConfig()
	return lc.Listen(context.Background(), "tcp", addr)
}
