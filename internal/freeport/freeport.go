// Package freeport picks loopback ports for the servers tests and reports start as child processes (a
// PostgreSQL, a nats-server, `rolter serve`) or bind by number (ZMQ endpoints).
//
// Picking a port by binding port 0 and closing it races with every other process on the machine: until the
// child binds it, the kernel may hand the same port to another listener bound to port 0, or to an outgoing
// connection - under go test ./..., another package's test server - and the test then talks to that. Ports
// below the kernel's ephemeral range (net.ipv4.ip_local_port_range) are never handed out that way, so
// Loopback picks there, and checks the port is free.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// Loopback returns a port on 127.0.0.1 that was free a moment ago: a random one below the ephemeral range
// when the kernel tells that range (Linux), else port 0's pick.
func Loopback() (int, error) {
	if lo := ephemeralLow(); lo > 2048 {
		span := min(lo-1024, 16384)
		for range 32 {
			port := lo - 1 - rand.IntN(span)
			if ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
				_ = ln.Close()
				return port, nil
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("cannot find a free port: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	return port, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range, 0 if unknown.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	lo, _ := strconv.Atoi(f[0])
	return lo
}
