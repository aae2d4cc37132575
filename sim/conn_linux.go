//go:build linux

package sim

import (
	"net"
	"syscall"
)

// connAlive reports whether the peer of c has not closed or reset the connection. fasthttp has
// no per-request signal for a gone client (valyala/fasthttp#874, #993), so a waiting request
// peeks at the socket without consuming bytes: EOF or an error other than EAGAIN means gone.
// The server does not read the connection while the handler or body stream runs, so the peek
// races with nothing.
func connAlive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := true
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == syscall.EAGAIN || err == syscall.EINTR:
		case err != nil || n == 0:
			alive = false
		}
		return true
	})
	return alive && err == nil
}
