package overhead

// Paths of the overhead report, in the order they are interleaved.
const (
	PathDirect  = "direct"
	PathRolter  = "rolter"
	PathHAProxy = "haproxy"
	// The yardsticks, bench/cmd/refproxy (Options.RefProxy), nothing of a gateway: PathNullFastHTTP
	// is `-mode fasthttp`, fasthttp's server configured as Rolter's and a pooled upstream connection - what
	// the server Rolter is built on reaches before any feature; PathNullNet is `-mode goroutine`, a goroutine
	// per client connection on Go's net package, relaying to an upstream connection of its own - what Go's
	// own serving model reaches; PathNullLean is `-mode lean`, null-fasthttp's relay without fasthttp's
	// server (a goroutine per connection, fasthttp's Request and Response, every read armed before the write
	// it waits on) - what a serving loop of Rolter's own could reach. Measured for latency and throughput
	// only (they frame answers by Content-Length, so no streams), judged by no goal.
	PathNullFastHTTP = "null-fasthttp"
	PathNullNet      = "null-net"
	PathNullLean     = "null-lean"
)
