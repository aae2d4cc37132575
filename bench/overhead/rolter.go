package overhead

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
)

// providerNames are the names of c's Rolter providers, one per target.
func providerNames(c *Case) []string {
	if c.Targets == 1 {
		return []string{"upstream"}
	}
	names := make([]string, c.Targets)
	for i := range names {
		names[i] = fmt.Sprintf("upstream-%d", i+1)
	}
	return names
}

// RolterConfig renders the Rolter config of case c: one route over c.Targets providers that all name the
// same upstream, default settings otherwise (routingMemory > 0 sets [server] routing_memory_bytes).
func RolterConfig(c *Case, listen, upstream string, routingMemory int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# overhead report, case %s: one route over %d provider(s), all the fake upstream\n", c.Name, c.Targets)
	fmt.Fprintf(&b, "[server]\nlisten = %q\n", listen)
	if routingMemory > 0 {
		fmt.Fprintf(&b, "routing_memory_bytes = %d\n", routingMemory)
	}
	names := providerNames(c)
	for _, n := range names {
		fmt.Fprintf(&b, "\n[[providers]]\nname = %q\napi_base = \"http://%s\"\n", n, upstream)
	}
	fmt.Fprintf(&b, "\n[[routes]]\nmodel = %q\nstrategy = %q\n", c.Model, c.Strategy)
	for _, n := range names {
		fmt.Fprintf(&b, "\n[[routes.targets]]\nprovider = %q\n", n)
	}
	return b.String()
}

// startRolter starts case c's `rolter serve` in front of upstream and waits until it is healthy.
func (r *harness) startRolter(ctx context.Context, c *Case, upstream string) error {
	u := unit{c, PathRolter}
	listen, err := r.listen(u)
	if err != nil {
		return err
	}
	routingMemory := 0
	if c.PromptBytes > 0 {
		routingMemory = r.o.RoutingMemory
	}
	cfgPath, err := r.writeConfig("rolter-"+c.Name+".toml", RolterConfig(c, listen, upstream, routingMemory))
	if err != nil {
		return err
	}
	gw, _, err := fleet.StartProc("rolter ("+c.Name+")", r.o.Rolter, []string{"serve", "-config", cfgPath, "-log-level", "warn"}, "", 0)
	if err != nil {
		return err
	}
	r.procs[u.gateway()] = gw
	if err := fleet.WaitHTTP(ctx, "http://"+listen+"/healthz", 15*time.Second, gw); err != nil {
		return fmt.Errorf("rolter (%s) did not come up: %w", c.Name, err)
	}
	return nil
}
