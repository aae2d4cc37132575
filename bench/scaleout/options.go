package scaleout

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/bench/routing"
	"github.com/rolter-ai/rolter/loadtest"
)

// Strategies are the strategies the scale-out report compares, in report order. Two variants of
// cache_aware show what the many-gateway features buy: "cache_aware-local" turns the rendezvous home off
// (route parameter home = false: each replica on the evidence of its own requests alone, as before the
// features), and "cache_aware+cluster" adds the evidence and in-flight counts the replicas share over NATS
// ([cluster], a nats-server started for the cell). Plain "cache_aware" is the default parameters: the home,
// no NATS. "pipeline+cluster" is pipeline scoring the shared evidence too.
var Strategies = []string{"round_robin", "consistent_hash", "cache_aware-local", "cache_aware", "cache_aware+cluster", "pipeline", "pipeline+cluster", "precise_cache_aware"}

// GoalStrategy is the variant the scale-out goals are judged on: cache_aware with every
// many-gateway feature on.
const GoalStrategy = "cache_aware+cluster"

// variant splits a report strategy name into the route's strategy and the config the variant adds
// after the route: route parameters, [cluster]; cluster says the cell needs a nats-server.
func variant(name string) (strategy string, local, cluster bool) {
	if s, ok := strings.CutSuffix(name, "+cluster"); ok {
		return s, false, true
	}
	if s, ok := strings.CutSuffix(name, "-local"); ok {
		return s, true, false
	}
	return name, false, false
}

// Scenarios are the workloads of the scale-out report: the two whose affinity a replica can
// lose (a group's or a conversation's next request landing on a replica that never saw its prefix).
var Scenarios = []string{loadtest.SharedPrefix, loadtest.MultiTurn}

// Gateways are the gateway counts of the scale-out report.
var Gateways = []int{1, 2, 4}

// maxGateways bounds the gateway processes one cell starts.
const maxGateways = 16

// ErrNoHAProxy is returned by Run when no haproxy binary is found.
var ErrNoHAProxy = errors.New("haproxy not found (make bench-scaleout installs the Debian package)")

// Options configure the scale-out report. Zero values take the defaults named; the fleet, the
// scale and the load are the routing report's (routing.Options), so a 1-gateway row is comparable with it.
type Options struct {
	// Rolter is the gateway binary (bin/rolter); HAProxy the haproxy binary and NATSServer the
	// nats-server binary (default: looked up in PATH, then /usr/sbin).
	Rolter, HAProxy, NATSServer string
	// Gateways are the gateway counts to run (Gateways).
	Gateways []int
	// Engines is the fleet size (8).
	Engines int
	// Scale divides the unscaled shapes' token counts and the engines' KV blocks (4, routing.Options.Scale).
	Scale int
	// Strategies and Scenarios to run (Strategies, Scenarios).
	Strategies []string
	Scenarios  []string
	// Concurrency is the closed-loop in-flight count (Engines × MaxNumSeqs × 3/4 = 24), and so the
	// number of client connections HAProxy spreads over the gateways.
	Concurrency int
	// MaxNumSeqs per engine (4), PrefillPerToken (100µs), DecodePerToken (1ms): as routing.Options.
	MaxNumSeqs      int
	PrefillPerToken time.Duration
	DecodePerToken  time.Duration
	// Seed of the workloads (1); repeat r uses Seed + r in every cell.
	Seed uint64
	// Repeats of the whole matrix (3); tables show the repeat with the median token hit rate.
	Repeats int
	// RunTimeout bounds the load of one cell (2m).
	RunTimeout time.Duration
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// Workloads, when set, replace routing.Workload for the scenarios they name (tests use small ones).
	Workloads map[string]loadtest.Workload
}

// routing returns the routing report's options that share o's fleet, scale and load, defaults filled.
func (o *Options) routing() routing.Options {
	r := routing.Options{
		Engines: o.Engines, Scale: o.Scale, Strategies: o.Strategies, Scenarios: o.Scenarios,
		Concurrency: o.Concurrency, MaxNumSeqs: o.MaxNumSeqs, PrefillPerToken: o.PrefillPerToken,
		DecodePerToken: o.DecodePerToken, Seed: o.Seed, Repeats: o.Repeats, RunTimeout: o.RunTimeout,
		Workloads: o.Workloads, Log: o.Log,
	}
	r.Normalize()
	return r
}

func (o *Options) normalize() error {
	if o.Strategies == nil {
		o.Strategies = Strategies
	}
	if o.Scenarios == nil {
		o.Scenarios = Scenarios
	}
	if o.Gateways == nil {
		o.Gateways = Gateways
	}
	if o.RunTimeout == 0 {
		o.RunTimeout = 2 * time.Minute
	}
	r := o.routing()
	o.Engines, o.Scale, o.Concurrency, o.MaxNumSeqs = r.Engines, r.Scale, r.Concurrency, r.MaxNumSeqs
	o.PrefillPerToken, o.DecodePerToken, o.Seed, o.Repeats, o.Log = r.PrefillPerToken, r.DecodePerToken, r.Seed, r.Repeats, r.Log
	if o.HAProxy == "" {
		o.HAProxy = fleet.LookSbin("haproxy")
	}
	if o.NATSServer == "" {
		o.NATSServer = fleet.LookSbin("nats-server")
	}
	var errs []error
	if o.Rolter == "" {
		errs = append(errs, errors.New("missing the rolter binary (-rolter)"))
	}
	if o.HAProxy == "" {
		errs = append(errs, ErrNoHAProxy)
	}
	if len(o.Gateways) == 0 {
		errs = append(errs, errors.New("no gateway count"))
	}
	for _, n := range o.Gateways {
		if n < 1 || n > maxGateways {
			errs = append(errs, fmt.Errorf("gateway count %d must be between 1 and %d", n, maxGateways))
		}
	}
	if o.Repeats < 1 || o.Engines < 1 {
		errs = append(errs, errors.New("repeats and engines must be positive"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cannot run the scale-out report: %w", err)
	}
	return nil
}
