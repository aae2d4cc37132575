package freeport

import (
	"net"
	"strconv"
	"testing"
)

// The ports come from below the ephemeral range where the kernel tells it, and are free to bind.
func TestLoopback(t *testing.T) {
	lo := ephemeralLow()
	for range 20 {
		port, err := Loopback()
		if err != nil {
			t.Fatal(err)
		}
		if lo > 2048 && (port >= lo || port < 1024) {
			t.Fatalf("port %d; want one under the ephemeral range starting at %d", port, lo)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("port %d: %v", port, err)
		}
		ln.Close()
	}
}
