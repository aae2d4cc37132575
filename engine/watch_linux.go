package engine

import (
	"syscall"
	"unsafe"
)

// tcpClosed reports whether the kernel has torn the TCP connection of fd down (state TCP_CLOSE, as after a
// reset). After a FIN, recv only ever says 0 bytes - even once a reset followed - so the state is the one
// place a departed client shows.
func tcpClosed(fd uintptr) bool {
	// struct tcp_info starts with the one-byte tcpi_state; the kernel copies as much as fits.
	var info [8]byte
	n := uint32(len(info))
	_, _, errno := syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_INFO,
		uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&n)), 0)
	const tcpClose = 7 // TCP_CLOSE in include/net/tcp_states.h
	return errno == 0 && n >= 1 && info[0] == tcpClose
}
