package overhead

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"

	"github.com/rolter-ai/rolter/loadtest"
)

// roundState is what one round measures, by case and path, and the next body number of each unit.
type roundState struct {
	res  map[string]map[string]*PathRound // case name -> path -> measurements
	seqs map[string]*atomic.Uint64        // unit key -> next body number
}

// newRoundState returns round's empty measurements. Every path of a case starts the round at the same
// body number, (round+1)·seqPhase: they all send the same bodies.
func newRoundState(rep *Report, round int) *roundState {
	s := &roundState{res: map[string]map[string]*PathRound{}, seqs: map[string]*atomic.Uint64{}}
	for _, c := range rep.Cases {
		s.res[c.Name] = map[string]*PathRound{}
		for _, p := range rep.Paths {
			s.res[c.Name][p] = &PathRound{}
			s.seqs[unit{c, p}.key()] = new(atomic.Uint64)
			s.seqs[unit{c, p}.key()].Store(uint64(round+1) * seqPhase)
		}
	}
	return s
}

func (s *roundState) at(u unit) *PathRound { return s.res[u.c.Name][u.path] }

// round measures round number round (from 0) and appends it to every case's rounds. Each kind of
// measurement visits every path of every case before the next kind, and the order of the cases and of
// the paths rotates every round, so slow drifts of a shared machine hit all alike.
func (r *harness) round(ctx context.Context, rep *Report, round int) error {
	s := newRoundState(rep, round)
	order := r.units(rep, round)
	if err := r.roundLatency(ctx, order, s); err != nil {
		return err
	}
	if err := r.roundSparse(ctx, rep, order, s); err != nil {
		return err
	}
	r.roundThroughput(ctx, order, s)
	r.roundStreams(ctx, order, s)
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, c := range rep.Cases {
		c.Rounds = append(c.Rounds, s.res[c.Name])
		r.logRound(round, c, rep.Paths, s.res[c.Name])
	}
	return nil
}

// roundLatency measures each unit at concurrency 1, LatencyRequests in a row.
func (r *harness) roundLatency(ctx context.Context, order []unit, s *roundState) error {
	for _, u := range order {
		l, err := r.latency(ctx, u, r.o.LatencyRequests, s.seqs[u.key()])
		if err != nil {
			return err
		}
		sort.Float64s(l.samples)
		x := s.at(u)
		x.LatencyP50, x.LatencyP99, x.LatencyErr = loadtest.Percentile(l.samples, 0.5), loadtest.Percentile(l.samples, 0.99), l.errors
	}
	return nil
}

// roundSparse measures, per case, its paths in turn at concurrency 1 (inTurn).
func (r *harness) roundSparse(ctx context.Context, rep *Report, order []unit, s *roundState) error {
	for _, c := range rep.Cases {
		var us []unit
		var useqs []*atomic.Uint64
		for _, u := range order {
			if u.c == c {
				us, useqs = append(us, u), append(useqs, s.seqs[u.key()])
			}
		}
		sp, err := r.inTurn(ctx, us, useqs, r.o.LatencyRequests)
		if err != nil {
			return err
		}
		for i, u := range us {
			sort.Float64s(sp[i].samples)
			x := s.at(u)
			x.SparseP50, x.SparseErr = loadtest.Percentile(sp[i].samples, 0.5), sp[i].errors
		}
	}
	return nil
}

// roundThroughput runs each unit's closed loop and the CPU counters around it.
func (r *harness) roundThroughput(ctx context.Context, order []unit, s *roundState) {
	for _, u := range order {
		t := r.throughput(ctx, u, r.o.ThroughputConcurrency, r.o.ThroughputDuration, s.seqs[u.key()])
		x := s.at(u)
		x.Throughput, x.TputP99, x.TputErr = t.rps, t.p99, t.errors
		x.ClientCPU, x.MachineCPU, x.OtherCPU, x.GatewayCPU = t.clientCPU, t.machineCPU, t.otherCPU, t.gatewayCPU
		x.GatewaySwitches = t.gatewaySwitches
	}
}

// roundStreams reads the first-byte and the paced streams through each unit of a streaming case but the
// yardsticks, which frame no streams.
func (r *harness) roundStreams(ctx context.Context, order []unit, s *roundState) {
	for _, u := range order {
		if !u.c.Streams || isYardstick(u.path) {
			continue
		}
		x := s.at(u)
		x.TTFB = r.firstBytes(ctx, u, x)
		r.pacedStreams(ctx, u, x)
	}
}

// firstBytes reads FirstByteStreams one-delta streams through u and returns the median time to their
// first byte; failures count in x.StreamErr.
func (r *harness) firstBytes(ctx context.Context, u unit, x *PathRound) float64 {
	var ttfbs []float64
	for range r.o.FirstByteStreams {
		st, err := r.stream(ctx, u, firstByteBody, 1)
		if err != nil {
			x.StreamErr++
			fmt.Fprintf(r.o.Log, "overhead: %s first-byte stream: %s\n", u.key(), err)
			continue
		}
		ttfbs = append(ttfbs, st.ttfb)
	}
	sort.Float64s(ttfbs)
	return loadtest.Percentile(ttfbs, 0.5)
}

// pacedStreams reads Streams paced streams through u into x's gaps, transits and jitter.
func (r *harness) pacedStreams(ctx context.Context, u unit, x *PathRound) {
	for range r.o.Streams {
		st, err := r.stream(ctx, u, streamBody, r.chunks)
		if err != nil {
			x.StreamErr++
			fmt.Fprintf(r.o.Log, "overhead: %s stream: %s\n", u.key(), err)
			continue
		}
		x.Gaps = append(x.Gaps, st.gaps...)
		x.Transit = append(x.Transit, st.transit...)
		for i := 1; i < len(st.transit); i++ {
			d := st.transit[i] - st.transit[i-1]
			x.Jitter = append(x.Jitter, max(d, -d))
		}
	}
}

// logRound writes one line per path of case c's round.
func (r *harness) logRound(round int, c *Case, paths []string, res map[string]*PathRound) {
	o := r.o
	for _, p := range paths {
		x := res[p]
		fmt.Fprintf(o.Log, "overhead: round %d %-11s %-7s c=1 p50 %6.0fµs p99 %6.0fµs | c=%d %7.0f req/s (CPUs: client %.2f, others %.2f, machine %.2f; gateway %.0fµs/req)",
			round+1, c.Name, p, x.LatencyP50, x.LatencyP99, o.ThroughputConcurrency, x.Throughput, x.ClientCPU, x.OtherCPU, x.MachineCPU, x.GatewayCPU)
		if c.Streams {
			fmt.Fprintf(o.Log, " | stream ttfb %6.0fµs", x.TTFB)
		}
		fmt.Fprintln(o.Log)
	}
}
