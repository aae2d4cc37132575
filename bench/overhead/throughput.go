package overhead

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/loadtest"
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
func (r *overheadRun) throughput(ctx context.Context, u unit, conc int, d time.Duration, seq *atomic.Uint64) throughputResult {
	c := r.clients[u.key()]
	var ok, failed atomic.Int64
	lat := make([][]float64, conc)
	gwPID := 0
	if p := r.procs[u.gateway()]; p != nil {
		gwPID = p.PID()
	}
	upPID := 0
	if p := r.procs["upstream"]; p != nil {
		upPID = p.PID()
	}
	busy0, okBusy := fleet.MachineBusy()
	irq0, okIRQ := interruptCPU()
	self0, okSelf := fleet.SelfCPU()
	gw0, okGW := procCPU(gwPID)
	up0, okUp := procCPU(upPID)
	sw0, okSw := procSwitches(gwPID)
	deadline := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
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
					failed.Add(1)
					continue
				}
				ok.Add(1)
				if len(lat[w]) < 100000 {
					lat[w] = append(lat[w], float64(time.Since(t))/float64(time.Microsecond))
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	busy1, okBusy1 := fleet.MachineBusy()
	irq1, okIRQ1 := interruptCPU()
	self1, okSelf1 := fleet.SelfCPU()
	gw1, okGW1 := procCPU(gwPID)
	up1, okUp1 := procCPU(upPID)
	sw1, okSw1 := procSwitches(gwPID)
	var all []float64
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Float64s(all)
	res := throughputResult{rps: float64(ok.Load()) / elapsed.Seconds(), p99: loadtest.Percentile(all, 0.99), errors: int(failed.Load()),
		count: ok.Load(), clientCPU: -1, machineCPU: -1, otherCPU: -1, gatewayCPU: -1, gatewaySwitches: -1}
	if okBusy && okBusy1 {
		res.machineCPU = (busy1 - busy0) / elapsed.Seconds()
	}
	if okSelf && okSelf1 {
		res.clientCPU = (self1 - self0) / elapsed.Seconds()
	}
	gwOK := gwPID == 0 || okGW && okGW1
	switch {
	case gwPID == 0:
		res.gatewayCPU = 0
	case gwOK && res.count > 0:
		res.gatewayCPU = (gw1 - gw0) * 1e6 / float64(res.count)
	}
	switch {
	case gwPID == 0:
		res.gatewaySwitches = 0
	case okSw && okSw1 && res.count > 0:
		res.gatewaySwitches = float64(sw1-sw0) / float64(res.count)
	}
	// Without an upstream process (tests) its CPU is this process's.
	upOK := upPID == 0 || okUp && okUp1
	if res.machineCPU >= 0 && res.clientCPU >= 0 && gwOK && upOK && okIRQ && okIRQ1 {
		res.otherCPU = max(0, res.machineCPU-res.clientCPU-((irq1-irq0)+(gw1-gw0)+(up1-up0))/elapsed.Seconds())
	}
	return res
}
