//go:build !race

package engine

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// TestAllocsRoutingPath pins ../shared/STYLE.md habit 1 for the request path up to the pick: body parse,
// prompt key, route lookup, eligibility and strategy ranking allocate nothing for a 20-message chat body.
func TestAllocsRoutingPath(t *testing.T) {
	for _, strategy := range []string{"round_robin", "random", "weighted", "least_load", "power_of_two"} {
		g, ctx := benchCall(t, strategy)
		c := g.acquireCall(g.snap.Load())
		allocs := testing.AllocsPerRun(200, func() {
			c.route = nil
			if e := c.prepare(ctx); e != nil {
				t.Fatal(e.message)
			}
		})
		if allocs != 0 {
			t.Fatalf("%s: %v allocs per request, want 0", strategy, allocs)
		}
	}
}

func TestAllocsRequestID(t *testing.T) {
	var ctx fasthttp.RequestCtx
	buf := make([]byte, 0, 64)
	if a := testing.AllocsPerRun(100, func() { buf = requestID(&ctx, buf[:0]) }); a != 0 {
		t.Fatalf("%v allocs", a)
	}
}
