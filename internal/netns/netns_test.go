package netns

import (
	"io"
	"net"
	"testing"
)

// TestRun: inside, two addresses of Range are bound and one reaches the other over loopback.
func TestRun(t *testing.T) {
	if !Run(t) {
		return
	}
	ln, err := net.Listen("tcp", Addr(1).String()+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = c.Write([]byte("hello"))
			c.Close()
		}
	}()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: Addr(2).AsSlice()}}
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, _ := io.ReadAll(c)
	if string(b) != "hello" || c.LocalAddr().(*net.TCPAddr).IP.String() != Addr(2).String() {
		t.Fatalf("read %q from %v", b, c.LocalAddr())
	}
}
