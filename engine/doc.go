// Package engine is the data plane: a fasthttp server that takes OpenAI-compatible requests, picks one
// upstream engine for each with a routing strategy, and streams the answer back, while it keeps the
// evidence of how well the routing did. The configuration comes from package config; the control plane,
// the cluster and the reports drive a Gateway through its exported methods and never reach inside.
//
// # One request's path
//
// In order (docs/architecture.md, "Request path", tells each step in full):
//
//   - gateway.go: New builds the server; serve checks the request (handler.go, loop.go) and dispatches
//     by path.
//   - call.go: post takes the live snapshot and a pooled call (begin: start time, request id, records;
//     a refusal before routing goes through refuse, which begins a call too); readBody reads the body within the body
//     memory; prepare scans the JSON for the model and the prompt key, finds the route and ranks the
//     eligible targets (health.go) with the route's strategy (strategy*.go, session.go); run admits
//     (admission.go) and attempts, retrying on another target when one fails.
//   - proxy.go: one attempt - send writes the upstream request on a pooled connection (upstream.go) in
//     the wire format of wire.go, head reads the response head, fail or succeed decide what follows.
//   - stream.go: the response body streamed to the client (Read, the SSE error event, CloseWithError)
//     while the client watch (watch*.go) notices a client that leaves.
//   - errors.go: writeError, the one writer of an error answer; call.go, finish: the one place a request
//     ends - status, metrics, the access log and trace (observe.go), the routing evidence (usage.go,
//     shadow.go, capture.go) - refusals included.
//
// # Who owns which state
//
//   - Gateway owns the live Snapshot (one atomic pointer), the observers, the socket budget and the
//     gateway-wide counters (in flight, body memory).
//   - A Snapshot (snapshot.go) is immutable once published: routes, targets and their strategies. A
//     request loads it once and finishes on it; reload builds the next one under Gateway.reloadMu, and the
//     replaced one retires when its last request has ended.
//   - A Provider (provider.go) is one upstream engine: its connection pool, in-flight counter, health and
//     pollers. It outlives snapshots while its identity holds, so load and health survive a reload.
//   - KV-event subscriptions (kvstate.go) and the engines' cache epochs (lifecycle.go) are shared by the
//     snapshots that use them, like providers.
//   - A call belongs to one request from post to release; it is pooled, so nothing may
//     keep a pointer into it after finish.
//
// # Concurrency
//
// Requests never lock: they read the snapshot pointer, padded atomics (load, health, admission) and the
// strategies' lock-free state (tries, session maps). Reloads are serialised by Gateway.reloadMu. Every
// background goroutine belongs to an object with start/stop that waits for it. The routing path does not
// allocate (allocation_test.go). docs/architecture.md, "Concurrency rules", holds the full list.
package engine
