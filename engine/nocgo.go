//go:build !cgo

package engine

// kvEventsSupported reports whether this build can subscribe to KV events (pebbe/zmq4 needs cgo and libzmq).
const kvEventsSupported = false
