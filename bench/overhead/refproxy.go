package overhead

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
)

// yardsticks are the refproxy paths and their -mode.
var yardsticks = []struct{ path, mode string }{{PathNullFastHTTP, "fasthttp"}, {PathNullNet, "goroutine"}, {PathNullLean, "lean"}}

func isYardstick(path string) bool {
	return slices.ContainsFunc(yardsticks, func(y struct{ path, mode string }) bool { return y.path == path })
}

// startYardsticks starts bench/cmd/refproxy in each of its modes in front of upstream for case c, when
// Options.RefProxy names it, and waits until each answers.
func (r *harness) startYardsticks(ctx context.Context, c *Case, upstream string) error {
	if r.o.RefProxy == "" {
		return nil
	}
	for _, y := range yardsticks {
		u := unit{c, y.path}
		listen, err := r.listen(u)
		if err != nil {
			return err
		}
		name := "refproxy -mode " + y.mode + " (" + c.Name + ")"
		np, _, err := fleet.StartProc(name, r.o.RefProxy, []string{"-mode", y.mode, "-listen", listen, "-upstream", upstream}, "", 0)
		if err != nil {
			return err
		}
		r.procs[u.gateway()] = np
		// Its GET /healthz is the upstream's, relayed.
		if err := fleet.WaitHTTP(ctx, "http://"+listen+"/healthz", 15*time.Second, np); err != nil {
			return fmt.Errorf("%s did not come up: %w", name, err)
		}
	}
	return nil
}
