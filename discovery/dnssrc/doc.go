// Package dnssrc is a discovery.Watcher for a [[sources]] entry of kind "dns": the engines a DNS name
// lists, asked again when the answer's TTL runs out.
//
// # What it asks
//
// With record = "srv" the name's SRV records give each engine's host and port; each target's addresses
// come from the answer's additional section when the server put them there (CoreDNS and dnsmasq do), and
// from A and AAAA queries of the target when it did not. An endpoint's Name is its SRV target. SRV
// priority and weight are not used: every target the name lists takes traffic, and the route's strategy
// shares it out. With record = "a" the name's A and AAAA records give the addresses, on the source's port,
// and an endpoint's Name is the name.
//
// Every endpoint is Ready (a DNS server lists what should take traffic: a Kubernetes headless Service
// lists ready pods only) and has no UID. The set is sorted by address and has each address once.
//
// # Talking to the server
//
// Queries are plain RFC 1035 queries, built and parsed with golang.org/x/net/dns/dnsmessage, sent to one
// server (the source's resolver, else the first nameserver of /etc/resolv.conf) through the dialer the
// gateway gives, so the egress policy governs the resolver's address too. Each goes over UDP with a random
// ID, and again over TCP when the answer is truncated (RFC 7766). No EDNS(0): a name with more records than
// 512 bytes hold costs a TCP connection, which is rare and always works.
//
// The server's bytes are treated as hostile. An answer counts only if its ID, question and opcode are the
// query's; other datagrams are dropped (a few, then the query fails) as forgeries or late answers. Parsing
// is linear in the message (dnsmessage follows at most 10 compression pointers per name), the records an
// answer may hold, the CNAME hops followed and the SRV targets resolved are bounded, and a UDP answer is
// read into a fixed buffer (a TCP one is at most 64 KiB, all its length prefix can say). FuzzAnswer holds
// the parser to never panicking.
//
// # What it reports
//
// NXDOMAIN, or an answer with no records, is a real state: no engines, reported as Set(nil). SERVFAIL and
// any other error RCODE, a timeout, a refused connection and an answer that does not parse are failures:
// Sink.Fail, the last set standing, and the round retried with backoff from min_ttl_secs doubling to
// max_ttl_secs. Either family's query failing fails the round, since a set without that family's addresses
// would drop engines that are there.
//
// An address the egress policy refuses (Options.Check), or one that is not unicast, is left out of the
// set and logged once while it stays refused: it is the operator's policy at work, not a failure of the
// source.
//
// Set is called after the first resolution, whenever the set changes, and after the first success that
// follows a failure (so the Fleet knows the source is back, even when its engines did not change).
//
// # When it asks
//
// The next round comes when the smallest TTL of the records used runs out (the SRV records, their targets'
// addresses, CNAMEs on the way; for an empty answer the SOA's negative TTL, RFC 2308), clamped to
// [min_ttl_secs, max_ttl_secs]. One Watch runs its rounds one after another on its own goroutine, with no
// other: an exchange's I/O is cut short when the context is done, and Watch returns then.
package dnssrc
