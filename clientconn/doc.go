// Package clientconn is the gateway's client connection layer, below the HTTP server and beside the
// upstream pool: the listening socket with TCP keepalive set once (Listen), the listener that admits client
// connections under [server] max_conns, max_conns_per_ip and the socket budget, never lets an accept error
// out, reclaims idle connections at the cap, waits for a request head holding no buffer and parks idle
// keep-alive connections (Limiter), the socket budget client and upstream connections share (Budget), and
// socket deadlines armed coarsely (CoarseDeadline, ReadDeadline), which the upstream pool uses too.
//
// It knows fasthttp's connection states and the configuration's [server] section, and nothing of the
// request path: the engine wires a Limiter into its fasthttp server (ConnState, Listener, SetServe) and
// hands its Budget to the upstream pool. The design is in docs/architecture.md, "Client listener and the
// socket budget".
package clientconn
