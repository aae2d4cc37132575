//go:build !cgo

package bench

// kvEventsBuild reports whether the simulated engines can publish KV events (ZMQ needs cgo).
const kvEventsBuild = false
