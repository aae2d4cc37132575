package overhead

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
)

// Options configure the overhead report. Zero values take the defaults named.
type Options struct {
	// Rolter is the gateway binary (bin/rolter); Upstream the fake upstream binary
	// (go build ./bench/cmd/fakeupstream); HAProxy the haproxy binary (default: looked up in PATH,
	// then /usr/sbin/haproxy). Without HAProxy the report still measures direct and Rolter. RefProxy, when
	// set, is bench/cmd/refproxy's binary, run as the yardsticks (PathNullFastHTTP, PathNullNet).
	Rolter, Upstream, HAProxy, RefProxy string
	// Strategy of the small-body case's route (round_robin).
	Strategy string
	// CacheTargets is the number of targets of the cache_aware case (4) and PromptBytes the size of its
	// user messages (8192).
	CacheTargets, PromptBytes int
	// FillTimeout bounds the cache_aware case's warm-up, which sends unique prompts through Rolter until
	// its tries evict (30s), so that every round measures full tries.
	FillTimeout time.Duration
	// Rounds of interleaved measurements (5).
	Rounds int
	// LatencyRequests per path, case and round at concurrency 1 (2000).
	LatencyRequests int
	// ThroughputConcurrency (64) and ThroughputDuration (3s) per path, case and round, closed loop.
	ThroughputConcurrency int
	ThroughputDuration    time.Duration
	// Streams per path and round on the paced SSE upstream, one at a time, small-body case only (5).
	Streams int
	// FirstByteStreams per path and round, one delta each, one at a time, small-body case only (50): their
	// first bytes make the first-byte figure, which the few long streams would leave to chance.
	FirstByteStreams int
	// SustainDuration of the RSS run per gateway and case at ThroughputConcurrency (20s).
	SustainDuration time.Duration
	// Log receives progress lines; nil discards them.
	Log io.Writer

	// Test hooks. UpstreamAddr is an upstream already listening (Upstream is then not started), sending
	// streamChunks deltas streamGap apart (64, 20ms); RoutingMemory is the cache_aware Rolter's [server]
	// routing_memory_bytes (0: its default); settle is the wait before the RSS read after a sustained run (2s).
	UpstreamAddr  string
	streamChunks  int
	streamGap     time.Duration
	RoutingMemory int
	settle        time.Duration
}

// DefaultOptions are the report's settings for the fields an Options leaves zero, and the
// command's flag defaults.
func DefaultOptions() Options {
	return Options{
		Strategy: "round_robin", CacheTargets: 4, PromptBytes: 8192, FillTimeout: 30 * time.Second,
		Rounds: 5, LatencyRequests: 2000, ThroughputConcurrency: 64, ThroughputDuration: 3 * time.Second,
		Streams: 5, FirstByteStreams: 50, SustainDuration: 20 * time.Second,
	}
}

func (o *Options) Normalize() error {
	d := DefaultOptions()
	fleet.OrDefault(&o.Strategy, d.Strategy)
	fleet.OrDefault(&o.CacheTargets, d.CacheTargets)
	fleet.OrDefault(&o.PromptBytes, d.PromptBytes)
	fleet.OrDefault(&o.FillTimeout, d.FillTimeout)
	fleet.OrDefault(&o.Rounds, d.Rounds)
	fleet.OrDefault(&o.LatencyRequests, d.LatencyRequests)
	fleet.OrDefault(&o.ThroughputConcurrency, d.ThroughputConcurrency)
	fleet.OrDefault(&o.ThroughputDuration, d.ThroughputDuration)
	fleet.OrDefault(&o.Streams, d.Streams)
	fleet.OrDefault(&o.FirstByteStreams, d.FirstByteStreams)
	fleet.OrDefault(&o.SustainDuration, d.SustainDuration)
	fleet.OrDefault(&o.streamChunks, streamChunks)
	fleet.OrDefault(&o.streamGap, streamGap)
	fleet.OrDefault(&o.settle, 2*time.Second)
	fleet.OrDefault(&o.Log, io.Discard)
	if o.HAProxy == "" {
		o.HAProxy = fleet.LookSbin("haproxy")
	}
	var errs []error
	if o.Rolter == "" {
		errs = append(errs, errors.New("missing the rolter binary (-rolter)"))
	}
	if o.Upstream == "" && o.UpstreamAddr == "" {
		errs = append(errs, errors.New("missing the fake upstream binary (-upstream)"))
	}
	if o.Rounds < 1 || o.LatencyRequests < 10 || o.ThroughputConcurrency < 1 || o.Streams < 1 || o.FirstByteStreams < 1 {
		errs = append(errs, errors.New("rounds, latency requests (>= 10), concurrency and streams must be positive"))
	}
	if o.CacheTargets < 1 || o.CacheTargets > 64 {
		errs = append(errs, fmt.Errorf("cache targets must be between 1 and 64, got %d", o.CacheTargets))
	}
	if o.PromptBytes < promptHeadLen+64 || o.PromptBytes > 1<<20 {
		errs = append(errs, fmt.Errorf("prompt bytes must be between %d and 1048576, got %d", promptHeadLen+64, o.PromptBytes))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cannot run the overhead report: %w", err)
	}
	return nil
}

const (
	streamChunks = 64
	streamGap    = 20 * time.Millisecond
	benchModel   = "fake"
	cacheModel   = "fake-cache"
)
