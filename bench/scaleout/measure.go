package scaleout

import (
	"context"
	"fmt"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/loadtest"
	"github.com/rolter-ai/rolter/sim"
)

// measure runs workload w through the started cell's HAProxy and fills run with what the client, HAProxy,
// the gateways and the engines counted. On error run keeps what was filled before it.
func (c *cell) measure(ctx context.Context, run *Trial, o *Options, sc sim.Config, w loadtest.Workload) error {
	base, _, _ := variant(run.Strategy)
	precise := base == "precise_cache_aware"
	if precise {
		// Let every gateway's subscribers connect before the first event is published (ZMQ drops
		// messages for subscribers that have not joined yet).
		if err := sleepCtx(ctx, time.Second); err != nil {
			return err
		}
	}
	before, err := haproxySessions(c.statsSock, run.Gateways)
	if err != nil {
		return err
	}
	sampler := fleet.StartSampler(c.sims, 20*time.Millisecond)
	res, err := loadtest.Run(ctx, loadtest.Options{
		URL:         c.URL,
		Workload:    w,
		Concurrency: o.Concurrency,
		Duration:    o.RunTimeout,
		Timeout:     time.Minute,
		TokenIDs:    precise,
		TokenizeURL: c.sims[0].URL(),
		Targets:     c.names,
		BlockSize:   sc.BlockSize,
		KeepSamples: true,
	})
	samples := sampler.Stop()
	if err != nil {
		return err
	}
	after, err := haproxySessions(c.statsSock, run.Gateways)
	if err != nil {
		return err
	}
	for i := range after {
		run.GatewayConnections = append(run.GatewayConnections, after[i]-before[i])
	}
	if err := c.countGateways(ctx, run); err != nil {
		return err
	}
	run.Inflight = fleet.SummarizeInflight(samples, len(c.sims))
	run.InflightCoV = cov(run.Inflight.Mean)
	c.countEngines(run)
	run.GroupsSplit, run.EnginesPerGroup = fleet.GroupSpread(res.Samples)
	res.Samples = nil // the report keeps aggregates only
	run.Result = res
	return nil
}

// countGateways fills run's per-gateway counters from each gateway's /metrics.
func (c *cell) countGateways(ctx context.Context, run *Trial) error {
	for i, gw := range c.gwURLs {
		st, err := scrapeGateway(ctx, gw)
		if err != nil {
			return fmt.Errorf("gateway %d: %w", i+1, err)
		}
		run.GatewayRequests = append(run.GatewayRequests, st.Requests)
		run.GatewayHitRate = append(run.GatewayHitRate, st.hitRate())
		run.GatewayKVEvents = append(run.GatewayKVEvents, st.KVEvents)
		run.GatewayKVTargets = append(run.GatewayKVTargets, st.KVTargets)
	}
	return nil
}

// countEngines fills run's requests per engine (the engines' own counters) and their CoV.
func (c *cell) countEngines(run *Trial) {
	var per []float64
	for _, e := range c.sims {
		r := int(e.Stats().Requests)
		run.EngineRequests = append(run.EngineRequests, r)
		per = append(per, float64(r))
	}
	run.EngineCoV = cov(per)
}
