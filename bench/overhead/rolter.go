package overhead

import (
	"fmt"
	"strings"
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
