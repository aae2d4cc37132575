package scaleout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/bench/routing"
	"github.com/rolter-ai/rolter/loadtest"
	"github.com/rolter-ai/rolter/sim"
)

// Run runs every (scenario, strategy, gateway count) cell Repeats times, each on a fresh fleet
// and fresh gateway processes, and evaluates the goals. A strategy the build lacks is recorded as
// unavailable and other failures of one cell in the cell; it returns an error when the options are
// unusable or ctx ends (with what was measured). Every process it starts is stopped before it returns.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.normalize(); err != nil {
		return nil, err
	}
	ro := o.routing()
	sc := ro.SimConfig()
	rep := &Report{
		Options: ReportOptions{
			Gateways: o.Gateways, Engines: o.Engines, Scale: o.Scale, Strategies: o.Strategies, Scenarios: o.Scenarios,
			Concurrency: o.Concurrency, MaxNumSeqs: o.MaxNumSeqs, NumBlocks: sc.NumBlocks, BlockSize: sc.BlockSize,
			PrefillPerToken: o.PrefillPerToken.String(), DecodePerToken: o.DecodePerToken.String(), Seed: o.Seed,
			Repeats: o.Repeats, RunTimeout: o.RunTimeout.String(),
		},
		Workloads: map[string]loadtest.Workload{},
		Versions:  versions(&o),
		Started:   time.Now(),
		Machine:   fleet.DescribeMachine(),
	}
	dir, err := os.MkdirTemp("", "rolter-scaleout-")
	if err != nil {
		return nil, fmt.Errorf("cannot create a work directory: %w", err)
	}
	defer os.RemoveAll(dir)
	finish := func() {
		rep.Goals = goalsOf(rep)
		rep.Seconds = time.Since(rep.Started).Seconds()
	}
	// The whole matrix is repeated rather than each cell back to back, and the gateway count varies
	// fastest, so a slow spell of a shared machine lands on neighbouring cells that are compared.
	for repeat := 0; repeat < o.Repeats; repeat++ {
		for _, scenario := range o.Scenarios {
			rep.Workloads[scenario] = ro.Workload(scenario, 0)
			for _, strategy := range o.Strategies {
				for _, n := range o.Gateways {
					if err := ctx.Err(); err != nil {
						finish()
						return rep, err
					}
					run := runCell(ctx, &o, &ro, sc, dir, scenario, strategy, n, repeat)
					rep.Runs = append(rep.Runs, run)
					logTrial(o.Log, run)
				}
			}
		}
	}
	finish()
	return rep, ctx.Err()
}

// versions asks the binaries the report runs for their versions; one that does not answer is left out.
func versions(o *Options) map[string]string {
	v := map[string]string{}
	if out, err := exec.Command(o.Rolter, "version").Output(); err == nil {
		v["rolter"] = string(bytes.TrimSpace(out))
	}
	if out, err := exec.Command(o.HAProxy, "-v").Output(); err == nil {
		v["haproxy"] = string(bytes.TrimSpace(bytes.SplitN(out, []byte("\n"), 2)[0]))
	}
	if o.NATSServer != "" {
		if out, err := exec.Command(o.NATSServer, "--version").Output(); err == nil {
			v["nats-server"] = string(bytes.TrimSpace(out))
		}
	}
	return v
}

// logTrial writes one progress line for a cell.
func logTrial(w io.Writer, run *Trial) {
	head := fmt.Sprintf("scaleout: #%d %-13s %-19s %d gw", run.Repeat+1, run.Scenario, run.Strategy, run.Gateways)
	switch {
	case run.Unavailable != "":
		fmt.Fprintf(w, "%s %s\n", head, run.Unavailable)
	case run.Error != "":
		fmt.Fprintf(w, "%s error: %s\n", head, fleet.FirstLine(run.Error))
	default:
		r := run.Result
		fmt.Fprintf(w, "%s hit %.3f (oracle %.3f) ttft p50 %.0fms p90 %.0fms cov %.3f per gateway %s errors %d (%.0fs)\n",
			head, r.HitRate, r.OracleHitRate, r.TTFT.P50, r.TTFT.P90, run.EngineCoV, joinInts(run.GatewayRequests),
			r.Failed+r.Cancelled, run.Seconds)
	}
}

// runCell measures one cell on a fresh fleet and fresh gateways.
func runCell(ctx context.Context, o *Options, ro *routing.Options, sc sim.Config, dir, scenario, strategy string, n, repeat int) *Trial {
	w := ro.Workload(scenario, repeat)
	run := &Trial{Scenario: scenario, Strategy: strategy, Gateways: n, Repeat: repeat, Seed: w.Seed}
	start := time.Now()
	defer func() { run.Seconds = time.Since(start).Seconds() }()
	if !runnable(run, o) {
		return run
	}
	cellDir, err := os.MkdirTemp(dir, "cell-")
	if err != nil {
		run.Error = fmt.Sprintf("cannot create a work directory: %s", err)
		return run
	}
	defer os.RemoveAll(cellDir)
	c := &cell{dir: cellDir}
	defer c.stop()
	err = c.start(ctx, o, sc, strategy, n)
	run.pids = c.pids()
	if err == nil {
		err = c.measure(ctx, run, o, sc, w)
	}
	if err != nil {
		run.Error = err.Error()
	}
	return run
}

// runnable reports whether run's strategy can run here; when not, it says why in run.
func runnable(run *Trial, o *Options) bool {
	base, _, cluster := variant(run.Strategy)
	if cluster && o.NATSServer == "" {
		run.Unavailable = "not available here: nats-server not found (make bench-scaleout installs the Debian package)"
		return false
	}
	if err := fleet.CheckStrategy(o.Engines, base); err != nil {
		var ue *fleet.UnavailableError
		if errors.As(err, &ue) {
			run.Unavailable = "not available in this build: " + ue.Reason
		} else {
			run.Error = err.Error()
		}
		return false
	}
	return true
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
