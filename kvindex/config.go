package kvindex

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// ErrNoCgo is returned by NewSubscriber in builds without cgo: the subscriber uses libzmq through
// github.com/pebbe/zmq4.
var ErrNoCgo = errors.New("kv_events needs a cgo build with libzmq (this binary was built with CGO_ENABLED=0)")

// SubscriberConfig configures the KV-event subscription of one target ([providers.kv_events]).
type SubscriberConfig struct {
	// Endpoint is the ZMQ address of the engine's PUB socket ("connect" mode, vLLM's default
	// tcp://*:5557 seen from the gateway) or the address the gateway binds its SUB to ("bind" mode,
	// llm-d style: the engine connects).
	Endpoint string
	// Topic is the subscription prefix ("" = every message).
	Topic string
	// ReplayEndpoint is the engine's ROUTER replay address; "" disables replay (gaps clear the target).
	ReplayEndpoint string
	// Mode is "connect" (default) or "bind".
	Mode string
	// StaleAfter marks the target untrusted after this long without a message; 0 disables it.
	StaleAfter time.Duration
	// MaxBlocks caps the resident blocks the index keeps for the target (LRU); 0 means
	// MaxBlocksPerTarget.
	MaxBlocks int
}

// Validate returns every problem of c at once.
func (c *SubscriberConfig) Validate() error {
	var errs []error
	if err := CheckEndpoint(c.Endpoint); err != nil {
		errs = append(errs, fmt.Errorf("cannot use endpoint: %w", err))
	}
	if c.ReplayEndpoint != "" {
		if err := CheckEndpoint(c.ReplayEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("cannot use replay_endpoint: %w", err))
		}
	}
	switch c.Mode {
	case "", "connect", "bind":
	default:
		errs = append(errs, fmt.Errorf("cannot use mode %q: want \"connect\" or \"bind\"", c.Mode))
	}
	if c.StaleAfter < 0 {
		errs = append(errs, fmt.Errorf("cannot use stale_secs %s: must not be negative", c.StaleAfter))
	}
	if c.MaxBlocks < 0 || c.MaxBlocks > MaxBlocksPerTarget {
		errs = append(errs, fmt.Errorf("cannot use max_blocks %d: must be in 0..%d", c.MaxBlocks, MaxBlocksPerTarget))
	}
	return errors.Join(errs...)
}

// CheckEndpoint reports whether ep is a ZMQ endpoint the subscriber can use: tcp://host:port (host may be
// "*" in bind mode), ipc://path or inproc://name. Config validation calls it so a config that passes
// `rolter check` never fails at subscribe time.
func CheckEndpoint(ep string) error {
	if ep == "" {
		return errors.New("empty address")
	}
	for _, scheme := range []string{"tcp://", "ipc://", "inproc://"} {
		if rest, ok := strings.CutPrefix(ep, scheme); ok {
			if rest == "" {
				return fmt.Errorf("%q has no address after the scheme", ep)
			}
			if scheme == "tcp://" {
				if _, _, err := net.SplitHostPort(rest); err != nil {
					return fmt.Errorf("%q: want tcp://host:port", ep)
				}
			}
			return nil
		}
	}
	return fmt.Errorf("%q: want tcp://, ipc:// or inproc://", ep)
}
