//go:build !linux

package clientconn

import (
	"net"
	"time"
)

// listenConfig leaves keepalive to Go, which sets it on each accepted connection.
func listenConfig() net.ListenConfig {
	return net.ListenConfig{KeepAlive: keepAliveSecs * time.Second}
}
