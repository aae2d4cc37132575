//go:build !cgo

package kvindex

import (
	"context"
	"log/slog"
)

// Supported reports whether this build can subscribe to KV events: not without cgo.
const Supported = false

// Subscriber is unavailable without cgo: NewSubscriber returns ErrNoCgo. The type exists so that callers
// compile in both builds.
type Subscriber struct{}

// NewSubscriber returns ErrNoCgo: the subscriber needs libzmq through cgo.
func NewSubscriber(ix *Index, logger *slog.Logger) (*Subscriber, error) {
	return nil, ErrNoCgo
}

// Add returns ErrNoCgo.
func (s *Subscriber) Add(t int, cfg SubscriberConfig) (*Stream, error) { return nil, ErrNoCgo }

// Stream returns nil.
func (s *Subscriber) Stream(t int) *Stream { return nil }

// Config returns no settings.
func (s *Subscriber) Config(t int) (SubscriberConfig, bool) { return SubscriberConfig{}, false }

// Start does nothing.
func (s *Subscriber) Start(ctx context.Context) {}

// Remove does nothing.
func (s *Subscriber) Remove(t int) {}

// Stop does nothing.
func (s *Subscriber) Stop() {}

// AuthErrors returns 0.
func (s *Subscriber) AuthErrors() uint64 { return 0 }

// curveAvailable does not matter without cgo: kv_events is refused as a whole.
func curveAvailable() bool { return true }
