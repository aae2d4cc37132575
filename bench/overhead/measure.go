package overhead

import (
	"context"
	"os"
	"sync/atomic"
	"time"
)

// Throughput is one closed loop through one gateway (Measure).
type Throughput struct {
	RPS         float64
	GatewayCPU  float64 // µs per request; -1: unknown
	MachineCPUs float64 // -1: unknown
	Errors      int
}

// Measure starts bin in the case (its route on strategy, when set, instead of the case's), warms it up (a route
// with tries until they evict, as the report does), measures one closed loop and stops it.
func Measure(ctx context.Context, o Options, bin, caseName, strategy string, warmup time.Duration, seq *atomic.Uint64) (Throughput, error) {
	o.Rolter = bin
	dir, err := os.MkdirTemp("", "rolter-ab-")
	if err != nil {
		return Throughput{}, err
	}
	defer os.RemoveAll(dir)
	r := newHarness(&o, dir)
	defer r.stopAll()
	rep := &Report{Versions: map[string]string{}}
	for _, c := range NewCases(&o) {
		if c.Name == caseName {
			rep.Cases = append(rep.Cases, c)
		}
	}
	c := rep.Cases[0]
	if strategy != "" {
		c.Strategy = strategy
	}
	if c.PromptBytes > 0 {
		c.BodyNanos = bodyNanos(c)
	}
	if err := r.start(ctx, rep); err != nil {
		return Throughput{}, err
	}
	u := unit{c, PathRolter}
	if c.PromptBytes > 0 {
		if _, err := r.fill(ctx, u, seq); err != nil {
			return Throughput{}, err
		}
	}
	r.throughput(ctx, u, o.ThroughputConcurrency, warmup, seq)
	t := r.throughput(ctx, u, o.ThroughputConcurrency, o.ThroughputDuration, seq)
	return Throughput{RPS: t.rps, GatewayCPU: t.gatewayCPU, MachineCPUs: t.machineCPU, Errors: t.errors}, ctx.Err()
}
