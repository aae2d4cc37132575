// Package routing is the routing-quality report (bench/cmd/routing, `make bench-routing`): every strategy
// on a fleet of simulated engines behind one in-process gateway, per scenario the token hit rate against
// the oracle bound, TTFT, throughput and the load spread, written as Markdown, JSON and PNG charts. It is
// the only report that draws charts (gonum/plot), so nothing the gateway binary links imports it.
package routing
