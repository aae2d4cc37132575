package config

import (
	"fmt"
	"strings"
)

// gatewayConfig returns the text of a config with one provider per URL (p0, p1, ...) and one route "m" of
// strategy over all of them, then extra.
func gatewayConfig(strategy string, extra string, urls ...string) string {
	var b strings.Builder
	b.WriteString("[server]\nlisten = \"127.0.0.1:0\"\n")
	for i, u := range urls {
		fmt.Fprintf(&b, "[[providers]]\nname = \"p%d\"\napi_base = %q\n", i, u)
	}
	fmt.Fprintf(&b, "[[routes]]\nmodel = \"m\"\nstrategy = %q\n", strategy)
	for i := range urls {
		fmt.Fprintf(&b, "[[routes.targets]]\nprovider = \"p%d\"\nmodel = \"up-model\"\n", i)
	}
	b.WriteString(extra)
	return b.String()
}
