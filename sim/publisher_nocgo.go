//go:build !cgo

package sim

import "errors"

// publisher needs libzmq through cgo; without cgo the engine serves HTTP only.
type publisher struct {
	pubEndpoint    string
	replayEndpoint string
}

const haveZMQ = false

var errNoZMQ = errors.New("cannot publish kv events: this binary was built without cgo, and the ZMQ publisher needs libzmq through cgo (rebuild with CGO_ENABLED=1, or run without --kv-events)")

func startPublisher(*Engine) (*publisher, error) { return nil, errNoZMQ }

func (*publisher) close() {}
