package overhead

import (
	"context"
	"sort"
	"sync/atomic"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/loadtest"
)

// RSSRun is the memory of one gateway process around a sustained run.
type RSSRun struct {
	Path string `json:"path"`
	PID  int    `json:"pid"`
	// IdleMiB is right after start, before any request; BeforeMiB just before the sustained run
	// (after the rounds); During are the samples of the run; AfterMiB 2s after it.
	IdleMiB   float64   `json:"idle_mib"`
	BeforeMiB float64   `json:"before_mib"`
	During    []float64 `json:"during_mib"`
	AfterMiB  float64   `json:"after_mib"`
	// MiddleMiB and LastMiB are the medians of the middle and last thirds of During; GrowthMiB
	// their difference. Flat = growth <= max(2 MiB, 5% of the middle third).
	MiddleMiB  float64 `json:"middle_third_mib"`
	LastMiB    float64 `json:"last_third_mib"`
	PeakMiB    float64 `json:"peak_mib"`
	GrowthMiB  float64 `json:"growth_mib"`
	Flat       bool    `json:"flat"`
	Requests   int64   `json:"requests"`
	Throughput float64 `json:"throughput_rps"`
	Errors     int64   `json:"errors"`
}

// sustain runs a closed loop through u for SustainDuration while sampling the gateway's RSS; the bodies
// are numbered from seq on.
func (r *harness) sustain(ctx context.Context, u unit, pid int, seq *atomic.Uint64) (*RSSRun, error) {
	rr := &RSSRun{Path: u.path, PID: pid}
	before, err := fleet.ReadRSS(pid)
	if err != nil {
		return nil, err
	}
	rr.BeforeMiB = mib(before)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if v, err := fleet.ReadRSS(pid); err == nil {
					rr.During = append(rr.During, mib(v))
				}
			}
		}
	}()
	t := r.throughput(ctx, u, r.o.ThroughputConcurrency, r.o.SustainDuration, seq)
	close(stop)
	<-sampled
	rr.Requests, rr.Throughput, rr.Errors = t.count, t.rps, int64(t.errors)
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(r.o.settle):
	}
	after, err := fleet.ReadRSS(pid)
	if err != nil {
		return nil, err
	}
	rr.AfterMiB = mib(after)
	rr.MiddleMiB, rr.LastMiB, rr.PeakMiB, rr.GrowthMiB, rr.Flat = rssTrend(rr.During)
	return rr, nil
}

// rssTrend reduces RSS samples of a sustained run: medians of the middle and last thirds (the
// first third is warm-up), the peak, the growth between the two thirds, and whether that growth
// is within max(2 MiB, 5% of the middle third).
func rssTrend(samples []float64) (middle, last, peak, growth float64, flat bool) {
	n := len(samples)
	if n < 3 {
		return 0, 0, 0, 0, false
	}
	med := func(v []float64) float64 {
		s := append([]float64(nil), v...)
		sort.Float64s(s)
		return loadtest.Percentile(s, 0.5)
	}
	middle, last = med(samples[n/3:2*n/3]), med(samples[2*n/3:])
	for _, v := range samples {
		peak = max(peak, v)
	}
	growth = last - middle
	return middle, last, peak, growth, growth <= max(2, 0.05*middle)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
