package overhead

import (
	"net"
	"syscall"
	"testing"
	"unsafe"
)

// BenchmarkSystemCall is what one system call costs on this machine, the unit the overhead report's ratios
// depend on most: HAProxy makes about 4 per proxied request, Rolter about 6 (docs/benchmarks/overhead.md).
// getpid is the bare entry and exit; peek is the recv(MSG_PEEK|MSG_DONTWAIT) that finds an idle loopback
// socket empty, the check Rolter makes before reusing a pooled upstream connection. On bare metal a system
// call takes a fraction of a microsecond; in a virtual machine whose guest kernel is entered through the
// hypervisor, as on the machine of the README's figures, about a microsecond or more.
func BenchmarkSystemCall(b *testing.B) {
	b.Run("getpid", func(b *testing.B) {
		for b.Loop() {
			syscall.RawSyscall(syscall.SYS_GETPID, 0, 0, 0)
		}
	})
	b.Run("peek", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		accepted := make(chan net.Conn, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		if peer, ok := <-accepted; ok {
			defer peer.Close()
		}
		rc, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			b.Fatal(err)
		}
		var fd uintptr
		if err := rc.Control(func(f uintptr) { fd = f }); err != nil {
			b.Fatal(err)
		}
		var buf [1]byte
		for b.Loop() {
			_, _, errno := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), 1,
				syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
			if errno != syscall.EAGAIN {
				b.Fatalf("peek at an idle socket: %v, want EAGAIN", errno)
			}
		}
	})
}
