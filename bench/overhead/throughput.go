package overhead

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rolter-ai/rolter/loadtest"
	"github.com/valyala/fasthttp"
)

type throughputResult struct {
	rps    float64
	p99    float64 // µs
	errors int
	count  int64
	// clientCPU, machineCPU and otherCPU: mean CPUs this process, the machine and the processes outside
	// the report kept busy; gatewayCPU: the gateway process's CPU µs per request (0 on the direct path).
	// gatewaySwitches: the gateway's context switches per request (0 on the direct path). -1: unknown.
	clientCPU, machineCPU, otherCPU, gatewayCPU, gatewaySwitches float64
}

// throughput runs a closed loop of conc requests in flight through u for d; the bodies are numbered from
// seq on, which it advances.
func (r *harness) throughput(ctx context.Context, u unit, conc int, d time.Duration, seq *atomic.Uint64) throughputResult {
	gwPID, upPID := r.pid(u.gateway()), r.pid("upstream")
	c0 := readCounters(gwPID, upPID)
	deadline := time.Now().Add(d)
	start := time.Now()
	l := &closedLoop{lat: make([][]float64, conc)}
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.loopWorker(ctx, u, deadline, seq, l, w)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	c1 := readCounters(gwPID, upPID)
	var all []float64
	for _, v := range l.lat {
		all = append(all, v...)
	}
	sort.Float64s(all)
	res := throughputResult{rps: float64(l.ok.Load()) / elapsed.Seconds(), p99: loadtest.Percentile(all, 0.99), errors: int(l.failed.Load()),
		count: l.ok.Load(), clientCPU: -1, machineCPU: -1, otherCPU: -1, gatewayCPU: -1, gatewaySwitches: -1}
	cpuOver(&res, c0, c1, elapsed.Seconds(), gwPID, upPID)
	return res
}

// closedLoop is what the workers of one closed loop count: answers, failures, and each worker's
// latencies (µs), lat[w] written by worker w only.
type closedLoop struct {
	ok, failed atomic.Int64
	lat        [][]float64
}

// maxSamples bounds the latencies one worker keeps.
const maxSamples = 100000

// loopWorker is worker w of a closed loop through u: one request in flight until deadline.
func (r *harness) loopWorker(ctx context.Context, u unit, deadline time.Time, seq *atomic.Uint64, l *closedLoop, w int) {
	c := r.clients[u.key()]
	req := NewRequest(r.addrs[u.key()])
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	var buf []byte
	for time.Now().Before(deadline) && ctx.Err() == nil {
		buf = u.c.body(buf[:0], seq.Add(1)-1)
		req.SetBodyRaw(buf)
		t := time.Now()
		if err := do(c, req, resp); err != nil {
			l.failed.Add(1)
			continue
		}
		l.ok.Add(1)
		if len(l.lat[w]) < maxSamples {
			l.lat[w] = append(l.lat[w], float64(time.Since(t))/float64(time.Microsecond))
		}
	}
}

// pid returns the PID of the process under key, 0 when there is none.
func (r *harness) pid(key string) int {
	if p := r.procs[key]; p != nil {
		return p.PID()
	}
	return 0
}
