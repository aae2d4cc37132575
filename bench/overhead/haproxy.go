package overhead

import (
	"fmt"
	"strings"
)

// haproxyConfig renders the HAProxy config of case c: a null proxy whose backend has c.Targets servers,
// all the upstream, balanced round robin.
func haproxyConfig(c *Case, listen, upstream, pidfile string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# overhead report, case %s: a null proxy in front of the fake upstream
global
    maxconn 4096
    pidfile %s

defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
    http-reuse always
    # Forward each SSE chunk as it comes instead of waiting to merge it with more data (without it
    # the first chunk of a stream waited ~200 ms here): what an operator proxying LLM streams sets.
    option http-no-delay

frontend fe
    bind %s
    default_backend be

backend be
    balance roundrobin
`, c.Name, pidfile, listen)
	for i := 0; i < c.Targets; i++ {
		fmt.Fprintf(&b, "    server s%d %s\n", i+1, upstream)
	}
	return b.String()
}
