package overhead

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// do sends one non-stream completion over c.
func do(c *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) error {
	if err := c.DoTimeout(req, resp, 10*time.Second); err != nil {
		return err
	}
	if resp.StatusCode() != http.StatusOK {
		return fmt.Errorf("status %d: %.200s", resp.StatusCode(), resp.Body())
	}
	return nil
}

func NewRequest(addr string) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.SetRequestURI("http://" + addr + "/v1/chat/completions")
	req.Header.SetMethod(http.MethodPost)
	req.Header.SetContentType("application/json")
	return req
}

type latencyResult struct {
	samples []float64 // µs
	errors  int
}

// latency sends n requests through u one after another and times each; the bodies are numbered from seq
// on, which it advances. A body is rendered before its request's clock starts.
func (r *harness) latency(ctx context.Context, u unit, n int, seq *atomic.Uint64) (latencyResult, error) {
	res, err := r.inTurn(ctx, []unit{u}, []*atomic.Uint64{seq}, n)
	return res[0], err
}

// inTurn sends n requests at concurrency 1 through each of us, in turn one through each, numbering the
// bodies of us[i] from seqs[i], and returns their latencies per unit. With several units, each gateway idles
// between two of its requests while the others serve theirs, as under sparse traffic, where requests in a
// row through one gateway keep it busy.
func (r *harness) inTurn(ctx context.Context, us []unit, seqs []*atomic.Uint64, n int) ([]latencyResult, error) {
	res := make([]latencyResult, len(us))
	reqs := make([]*fasthttp.Request, len(us))
	for i, u := range us {
		reqs[i] = NewRequest(r.addrs[u.key()])
		defer fasthttp.ReleaseRequest(reqs[i])
		res[i].samples = make([]float64, 0, n)
	}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	bufs := make([][]byte, len(us))
	for k := 0; k < n; k++ {
		if k%256 == 0 && ctx.Err() != nil {
			return res, ctx.Err()
		}
		for i, u := range us {
			bufs[i] = u.c.body(bufs[i][:0], seqs[i].Add(1)-1)
			// The request only reads the buffer, and DoTimeout is done with it when it returns.
			reqs[i].SetBodyRaw(bufs[i])
			start := time.Now()
			err := do(r.clients[u.key()], reqs[i], resp)
			d := time.Since(start)
			if err != nil {
				res[i].errors++
				if res[i].errors > n/10 {
					return res, fmt.Errorf("%s: too many errors at concurrency 1: %w", u.key(), err)
				}
				continue
			}
			res[i].samples = append(res[i].samples, float64(d)/float64(time.Microsecond))
		}
	}
	return res, nil
}
