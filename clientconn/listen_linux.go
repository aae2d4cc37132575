package clientconn

import (
	"net"
	"syscall"
)

// listenConfig sets TCP keepalive on the listening socket, which Linux copies into every socket it accepts
// (the accepted socket is a clone of the listener's), and turns off Go's own per-connection setting: the
// same keepalive as Go's defaults, for one setsockopt of each option at start instead of four system calls
// per accepted connection.
func listenConfig() net.ListenConfig {
	return net.ListenConfig{KeepAlive: -1, Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) {
			for _, o := range [...]struct{ level, opt, v int }{
				{syscall.SOL_SOCKET, syscall.SO_KEEPALIVE, 1},
				{syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE, keepAliveSecs},
				{syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL, keepAliveSecs},
				{syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT, keepAliveProbes},
			} {
				if err == nil {
					err = syscall.SetsockoptInt(int(fd), o.level, o.opt, o.v)
				}
			}
		}); cerr != nil {
			return cerr
		}
		return err
	}}
}
