package overhead

import (
	"context"
	"fmt"
	"os"
	"sort"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/loadtest"
)

// Run measures the fake upstream directly, through `rolter serve` and through HAProxy, for each
// case, in interleaved rounds, then each gateway's RSS around a sustained run. Every process it starts
// is stopped before it returns, also on errors.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.Normalize(); err != nil {
		return nil, err
	}
	rep := &Report{
		Started: time.Now(), Machine: fleet.DescribeMachine(), Versions: map[string]string{},
		Options: ReportOptions{
			Strategy: o.Strategy, CacheTargets: o.CacheTargets, PromptBytes: o.PromptBytes, FillTimeout: o.FillTimeout.String(),
			Rounds: o.Rounds, LatencyRequests: o.LatencyRequests,
			ThroughputConcurrency: o.ThroughputConcurrency, ThroughputDuration: o.ThroughputDuration.String(),
			Streams: o.Streams, FirstByteStreams: o.FirstByteStreams, StreamChunks: o.streamChunks, StreamGap: o.streamGap.String(), SustainDuration: o.SustainDuration.String(),
		},
		Cases: NewCases(&o),
	}
	dir, err := os.MkdirTemp("", "rolter-overhead-")
	if err != nil {
		return nil, fmt.Errorf("cannot create a work directory: %w", err)
	}
	defer os.RemoveAll(dir)
	r := &overheadRun{o: &o, dir: dir, addrs: map[string]string{}, procs: map[string]*fleet.Proc{}, clients: map[string]*fasthttp.HostClient{},
		chunks: o.streamChunks}
	defer r.stopAll()
	if err := r.start(ctx, rep); err != nil {
		return nil, err
	}
	idle := map[string]float64{}
	for key, pr := range r.procs {
		if rss, err := fleet.ReadRSS(pr.PID()); err == nil {
			idle[key] = mib(rss)
		}
	}
	for _, c := range rep.Cases {
		if c.PromptBytes > 0 {
			c.BodyNanos = bodyNanos(c)
		}
	}

	fmt.Fprintf(o.Log, "overhead: warming up %v on %d cases\n", rep.Paths, len(rep.Cases))
	var warm atomic.Uint64 // warm-up bodies: sequence numbers from 0
	for _, u := range r.units(rep, 0) {
		if _, err := r.latency(ctx, u, min(300, o.LatencyRequests), &warm); err != nil {
			return nil, err
		}
		r.throughput(ctx, u, o.ThroughputConcurrency, min(500*time.Millisecond, o.ThroughputDuration), &warm)
	}
	if c := rep.Case(CaseCache); c != nil {
		ts, err := r.fill(ctx, unit{c, PathRolter}, &warm)
		if err != nil {
			return nil, err
		}
		c.Tries = ts
		fmt.Fprintf(o.Log, "overhead: %s tries filled in %.1fs (%d requests): %.0f prompts, %.0f evictions\n",
			c.Name, ts.FillSeconds, ts.FillRequests, ts.AfterFill.Prompts, ts.AfterFill.Evictions)
		if !ts.Filled {
			rep.Notes = append(rep.Notes, fmt.Sprintf("the %s case's tries did not evict within the %s warm-up (%d requests): "+
				"the first rounds measured tries that were still growing.", c.Name, o.FillTimeout, ts.FillRequests))
		}
	}

	for round := 0; round < o.Rounds; round++ {
		res := map[string]map[string]*PathRound{}
		seqs := map[string]*atomic.Uint64{}
		for _, c := range rep.Cases {
			res[c.Name] = map[string]*PathRound{}
			for _, p := range rep.Paths {
				res[c.Name][p] = &PathRound{}
				// Every path of a case starts the round at the same number: they all send the same bodies.
				seqs[unit{c, p}.key()] = new(atomic.Uint64)
				seqs[unit{c, p}.key()].Store(uint64(round+1) * seqPhase)
			}
		}
		// Each kind of measurement visits every path of every case before the next kind, and the order of
		// the cases and of the paths rotates every round, so slow drifts of a shared machine hit all alike.
		order := r.units(rep, round)
		for _, u := range order {
			l, err := r.latency(ctx, u, o.LatencyRequests, seqs[u.key()])
			if err != nil {
				return nil, err
			}
			sort.Float64s(l.samples)
			x := res[u.c.Name][u.path]
			x.LatencyP50, x.LatencyP99, x.LatencyErr = loadtest.Percentile(l.samples, 0.5), loadtest.Percentile(l.samples, 0.99), l.errors
		}
		for _, c := range rep.Cases {
			var us []unit
			var useqs []*atomic.Uint64
			for _, u := range order {
				if u.c == c {
					us, useqs = append(us, u), append(useqs, seqs[u.key()])
				}
			}
			sp, err := r.inTurn(ctx, us, useqs, o.LatencyRequests)
			if err != nil {
				return nil, err
			}
			for i, u := range us {
				sort.Float64s(sp[i].samples)
				x := res[c.Name][u.path]
				x.SparseP50, x.SparseErr = loadtest.Percentile(sp[i].samples, 0.5), sp[i].errors
			}
		}
		for _, u := range order {
			t := r.throughput(ctx, u, o.ThroughputConcurrency, o.ThroughputDuration, seqs[u.key()])
			x := res[u.c.Name][u.path]
			x.Throughput, x.TputP99, x.TputErr = t.rps, t.p99, t.errors
			x.ClientCPU, x.MachineCPU, x.OtherCPU, x.GatewayCPU = t.clientCPU, t.machineCPU, t.otherCPU, t.gatewayCPU
			x.GatewaySwitches = t.gatewaySwitches
		}
		for _, u := range order {
			if !u.c.Streams || isYardstick(u.path) {
				continue
			}
			x := res[u.c.Name][u.path]
			var ttfbs []float64
			for s := 0; s < o.FirstByteStreams; s++ {
				st, err := r.stream(ctx, u, firstByteBody, 1)
				if err != nil {
					x.StreamErr++
					fmt.Fprintf(o.Log, "overhead: %s first-byte stream: %s\n", u.key(), err)
					continue
				}
				ttfbs = append(ttfbs, st.ttfb)
			}
			for s := 0; s < o.Streams; s++ {
				st, err := r.stream(ctx, u, streamBody, r.chunks)
				if err != nil {
					x.StreamErr++
					fmt.Fprintf(o.Log, "overhead: %s stream: %s\n", u.key(), err)
					continue
				}
				x.Gaps = append(x.Gaps, st.gaps...)
				x.Transit = append(x.Transit, st.transit...)
				for i := 1; i < len(st.transit); i++ {
					d := st.transit[i] - st.transit[i-1]
					x.Jitter = append(x.Jitter, max(d, -d))
				}
			}
			sort.Float64s(ttfbs)
			x.TTFB = loadtest.Percentile(ttfbs, 0.5)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for _, c := range rep.Cases {
			c.Rounds = append(c.Rounds, res[c.Name])
			for _, p := range rep.Paths {
				x := res[c.Name][p]
				fmt.Fprintf(o.Log, "overhead: round %d %-11s %-7s c=1 p50 %6.0fµs p99 %6.0fµs | c=%d %7.0f req/s (CPUs: client %.2f, others %.2f, machine %.2f; gateway %.0fµs/req)",
					round+1, c.Name, p, x.LatencyP50, x.LatencyP99, o.ThroughputConcurrency, x.Throughput, x.ClientCPU, x.OtherCPU, x.MachineCPU, x.GatewayCPU)
				if c.Streams {
					fmt.Fprintf(o.Log, " | stream ttfb %6.0fµs", x.TTFB)
				}
				fmt.Fprintln(o.Log)
			}
		}
	}
	for _, c := range rep.Cases {
		summarizeOverhead(c, rep.Paths)
		if c.Tries != nil {
			snap, err := r.trieSnapshot(unit{c, PathRolter})
			if err != nil {
				return nil, err
			}
			c.Tries.AfterRounds = snap
		}
	}
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
				return nil, err
			}
			rr.IdleMiB = idle[u.gateway()]
			c.RSS = append(c.RSS, rr)
		}
	}
	rep.Goals = goalsOf(rep)
	rep.Seconds = time.Since(rep.Started).Seconds()
	return rep, nil
}

// units returns every path of every case in the order of round: the cases, and the paths within each,
// rotated by round.
func (r *overheadRun) units(rep *Report, round int) []unit {
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
