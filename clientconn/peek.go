package clientconn

import (
	"crypto/tls"
	"net"
	"syscall"
)

// PeekSocket's results.
const (
	PeekNothing = iota // the wait was interrupted
	PeekData
	PeekEOF
	PeekReset
)

// PeekSocket waits until the socket under rc is readable - or a deadline, its close, or a past deadline
// set to interrupt it - and looks at it without consuming anything (MSG_PEEK): PeekData, PeekEOF (the peer
// sent a FIN), PeekReset (an error), or PeekNothing when the wait ended without a look.
func PeekSocket(rc syscall.RawConn) int {
	var buf [1]byte
	res := PeekNothing
	err := rc.Read(func(fd uintptr) bool {
		for {
			n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
				return false // not readable yet: park until it is
			case err != nil:
				res = PeekReset
			case n == 0:
				res = PeekEOF
			default:
				res = PeekData
			}
			return true
		}
	})
	if err != nil {
		return PeekNothing
	}
	return res
}

// RawConn returns the socket under c, below a TLS connection, or nil when c has none.
func RawConn(c net.Conn) syscall.RawConn {
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
