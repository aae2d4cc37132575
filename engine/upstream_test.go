package engine

import (
	"net"
	"testing"
	"time"
)

// TestReadDeadlineSocket: over a real socket, the upstream connection's read keeps waiting through the
// timeout of a socket deadline armed before the one asked for, and times out no earlier than that one.
func TestReadDeadlineSocket(t *testing.T) {
	nc := silentPeer(t)
	c := &uconn{nc: nc}
	start := time.Now()
	_ = c.rd.SetAfter(start, 100*time.Millisecond, nc.SetReadDeadline)
	_ = c.rd.SetAfter(start, 400*time.Millisecond, nc.SetReadDeadline) // kept: the socket times out at 106 ms
	var b [1]byte
	_, err := readerFunc{c}.Read(b[:])
	waited := time.Since(start)
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("read: %v, want a timeout", err)
	}
	if waited < 400*time.Millisecond {
		t.Fatalf("timed out after %v, before the 400ms asked for", waited)
	}
}

// silentPeer returns a loopback TCP connection whose peer never writes; both close when the test ends.
func silentPeer(t *testing.T) net.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	return nc
}
