package overhead

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
)

// Run measures the fake upstream directly, through `rolter serve` and through HAProxy, for each
// case, in interleaved rounds, then each gateway's RSS around a sustained run. Every process it starts
// is stopped before it returns, also on errors.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.Normalize(); err != nil {
		return nil, err
	}
	rep := newReport(&o)
	dir, err := os.MkdirTemp("", "rolter-overhead-")
	if err != nil {
		return nil, fmt.Errorf("cannot create a work directory: %w", err)
	}
	defer os.RemoveAll(dir)
	r := newHarness(&o, dir)
	defer r.stopAll()
	if err := r.start(ctx, rep); err != nil {
		return nil, err
	}
	idle := r.idleRSS()
	for _, c := range rep.Cases {
		if c.PromptBytes > 0 {
			c.BodyNanos = bodyNanos(c)
		}
	}
	if err := r.warmUp(ctx, rep); err != nil {
		return nil, err
	}
	for round := 0; round < o.Rounds; round++ {
		if err := r.round(ctx, rep, round); err != nil {
			return nil, err
		}
	}
	if err := r.summarize(rep); err != nil {
		return nil, err
	}
	if err := r.sustainAll(ctx, rep, idle); err != nil {
		return nil, err
	}
	rep.Goals = goalsOf(rep)
	rep.Seconds = time.Since(rep.Started).Seconds()
	return rep, nil
}

// newReport returns the report of o before any measurement: its settings and cases.
func newReport(o *Options) *Report {
	return &Report{
		Started: time.Now(), Machine: fleet.DescribeMachine(), Versions: map[string]string{},
		Options: ReportOptions{
			Strategy: o.Strategy, CacheTargets: o.CacheTargets, PromptBytes: o.PromptBytes, FillTimeout: o.FillTimeout.String(),
			Rounds: o.Rounds, LatencyRequests: o.LatencyRequests,
			ThroughputConcurrency: o.ThroughputConcurrency, ThroughputDuration: o.ThroughputDuration.String(),
			Streams: o.Streams, FirstByteStreams: o.FirstByteStreams, StreamChunks: o.streamChunks, StreamGap: o.streamGap.String(), SustainDuration: o.SustainDuration.String(),
		},
		Cases: NewCases(o),
	}
}

// idleRSS returns the RSS (MiB) of every process right after start, by process key.
func (r *harness) idleRSS() map[string]float64 {
	idle := map[string]float64{}
	for key, pr := range r.procs {
		if rss, err := fleet.ReadRSS(pr.PID()); err == nil {
			idle[key] = mib(rss)
		}
	}
	return idle
}

// warmUp sends every path of every case a short latency run and a short closed loop, then fills the
// cache_aware case's tries (fill). Warm-up bodies are numbered from 0, below every round's.
func (r *harness) warmUp(ctx context.Context, rep *Report) error {
	o := r.o
	fmt.Fprintf(o.Log, "overhead: warming up %v on %d cases\n", rep.Paths, len(rep.Cases))
	var warm atomic.Uint64
	for _, u := range r.units(rep, 0) {
		if _, err := r.latency(ctx, u, min(300, o.LatencyRequests), &warm); err != nil {
			return err
		}
		r.throughput(ctx, u, o.ThroughputConcurrency, min(500*time.Millisecond, o.ThroughputDuration), &warm)
	}
	c := rep.Case(CaseCache)
	if c == nil {
		return nil
	}
	ts, err := r.fill(ctx, unit{c, PathRolter}, &warm)
	if err != nil {
		return err
	}
	c.Tries = ts
	fmt.Fprintf(o.Log, "overhead: %s tries filled in %.1fs (%d requests): %.0f prompts, %.0f evictions\n",
		c.Name, ts.FillSeconds, ts.FillRequests, ts.AfterFill.Prompts, ts.AfterFill.Evictions)
	if !ts.Filled {
		rep.Notes = append(rep.Notes, fmt.Sprintf("the %s case's tries did not evict within the %s warm-up (%d requests): "+
			"the first rounds measured tries that were still growing.", c.Name, o.FillTimeout, ts.FillRequests))
	}
	return nil
}

// summarize fills every case's summary from its rounds and reads the tries after the rounds.
func (r *harness) summarize(rep *Report) error {
	for _, c := range rep.Cases {
		summarize(c, rep.Paths)
		if c.Tries != nil {
			snap, err := r.trieSnapshot(unit{c, PathRolter})
			if err != nil {
				return err
			}
			c.Tries.AfterRounds = snap
		}
	}
	return nil
}

// sustainAll runs the sustained run through every gateway of every case (sustain); idle is idleRSS's.
// Each run's bodies are numbered from past the last round's.
func (r *harness) sustainAll(ctx context.Context, rep *Report, idle map[string]float64) error {
	o := r.o
	for _, c := range rep.Cases {
		seq := uint64(o.Rounds+1) * seqPhase
		for _, p := range []string{PathRolter, PathHAProxy} {
			u := unit{c, p}
			pr := r.procs[u.gateway()]
			if pr == nil {
				continue
			}
			fmt.Fprintf(o.Log, "overhead: sustained run through %s for %s (RSS sampled)\n", u.key(), o.SustainDuration)
			var s atomic.Uint64
			s.Store(seq)
			rr, err := r.sustain(ctx, u, pr.PID(), &s)
			if err != nil {
				return err
			}
			rr.IdleMiB = idle[u.gateway()]
			c.RSS = append(c.RSS, rr)
		}
	}
	return nil
}

// units returns every path of every case in the order of round: the cases, and the paths within each,
// rotated by round.
func (r *harness) units(rep *Report, round int) []unit {
	var out []unit
	for i := range rep.Cases {
		c := rep.Cases[(i+round)%len(rep.Cases)]
		for _, p := range rotate(rep.Paths, round) {
			out = append(out, unit{c, p})
		}
	}
	return out
}

func rotate(s []string, k int) []string {
	out := make([]string, len(s))
	for i := range s {
		out[i] = s[(i+k)%len(s)]
	}
	return out
}
