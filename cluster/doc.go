// Package cluster lets the gateway replicas of one fleet share what each learns from the requests it
// routes, over NATS ([cluster] in rolter.toml, docs/architecture.md "Many gateways"). Behind an L4
// balancer every replica sees a slice of each conversation; without sharing, the replica that gets a
// conversation's second turn does not know which engine holds its first turn's prefix.
//
// # What is shared
//
// Two things, each on its own subject under [cluster] subject:
//
//   - Evidence (<subject>.evidence): for every request a replica sends, the engine it went to
//     (engine.PeerID) and the checkpoints of its prompt key (engine.Peers: chained hashes of the key's
//     leading bytes at fixed offsets, the same on every replica). A replica that receives it scores that
//     engine as holding the prefix as far as the checkpoints reach, next to its own trie (cache_aware).
//   - In-flight counts (<subject>.load): every interval, each replica's own in-flight requests per
//     provider. A replica adds the sum over its live peers to each provider's load
//     (Gateway.SetPeerLoads), so least_load and the overload rule see the fleet's requests, not its own
//     share. The message is also the heartbeat: a peer not heard from for max(3 x interval, 1 s) is
//     forgotten, and its requests with it.
//
// The heartbeat also sizes the rate limits: every interval, while connected, the gateway is told it keeps
// its keys' and orgs' limits as one of 1 + live peers replicas (Gateway.SetLimitShare), each holding that
// share. While NATS is unreachable the share is left as it was: the peers go unheard, not away.
//
// No prompt text crosses the wire: a checkpoint is a 64-bit hash, and the load message holds provider
// names and counts.
//
// # Who may speak
//
// Whoever can publish on the subjects steers routing: claimed in-flight counts move requests off engines,
// and evidence makes a conversation no replica saw a prefix hit on an engine of the sender's choice. Three
// layers stop that:
//
//   - NATS's own authentication ([cluster] user_env/password_env, token_env, nkey_seed_file or creds_file;
//     tls_ca_file, tls_cert_file and tls_key_file), read from the environment or from files, never from
//     the config file: the server decides who connects and, with its permissions, who publishes there.
//     A refusal of the credentials is logged as such, once per transition, and retried like any outage.
//   - A shared key (key_env, at least 32 bytes; required when a nats_url is off loopback, else a Warn at
//     start): every message travels in an envelope (auth.go) holding a timestamp and an HMAC-SHA256, cut
//     to 128 bits, over the subject, the timestamp and the body. A message without a valid MAC, more than
//     10 s from the receiver's clock, or not later than the last accepted from its sender, is refused and
//     counted; the replicas' clocks must agree within 10 s (NTP). Verifying allocates nothing
//     (TestApplySealedEvidenceAllocs) and costs a SHA-256 pass over the message. Without a key the bare
//     messages of wire.go are sent, and a replica with a key refuses them (mixed fleets do not share).
//   - Bounds on any one sender, key or not: its in-flight count on a provider is cut to max_peer_inflight
//     or the provider's max_conns, whichever is lower (a replica of the same config cannot have more in
//     flight); its evidence to peer_evidence_per_sec records a second (a token bucket holding a second's
//     worth; a message over it is refused whole); and at most max_peers senders are remembered, for
//     evidence and for loads each. A key holder can still lie within these bounds: the key says the
//     sender is of the fleet, not that it is honest. Without a key an attacker on the subject can
//     still claim up to the caps from max_peers made-up ids, and plant evidence at their rate: the bounds
//     limit the damage, the key prevents it.
//
// # Design
//
//	request goroutines                          publisher goroutine (Cluster.run)
//	  Routed(engine, cps) -> queue ----------->  every interval, or at 32 KiB queued: encode a batch,
//	     (bounded chan of fixed records;           skip records already sent this interval, publish;
//	      full: drop, count queue_full)            publish the in-flight counts; forget quiet peers
//	  Held(engine, cps) <- table  <-----------  evidence subscription (nats.go calls it serially):
//	     (lock-free reads, binary search           decode, insert every checkpoint stamped now
//	      over the prefix-closed evidence)       load subscription: update the peers' sums, SetPeerLoads
//
// The table (table.go) is a fixed array of 16-byte slots (key, coarse stamp) in buckets of 8, sized once
// from max_entries and never grown; a key mixes a checkpoint with an engine. It has one writer, the
// evidence subscription's handler, and lock-free readers: Held reads at most 2 + log2(len(cps)) buckets and
// allocates nothing. Evidence is prefix-closed (a record carries every checkpoint of its key from the
// first), so Held finds the longest held prefix by binary search. A full bucket replaces its oldest slot;
// entries older than evidence_ttl_secs do not count.
//
// # Loss-tolerant by construction
//
// Evidence is a hint about where a prefix is cached, never a fact a request depends on: every request is
// still routed to an eligible target by the local rules, and engines still compute whatever they do not
// hold. A lost, late, duplicated or evicted message costs affinity - a request may land where its prefix
// is cold - never correctness. So the package uses core NATS (at most once), with no acknowledgement,
// retransmission, ordering or persistence, and drops rather than waits everywhere: a full queue drops a
// record, a publish while disconnected drops the batch (nats.go's reconnect buffer is off: evidence is
// worth little late), a handler that falls behind loses messages to nats.go's pending limits
// (slow_consumer). Every drop is counted.
//
// # Bounded
//
// Bandwidth: a request adds at most one record of 9 + 8 x 96 = 777 bytes (265 bytes for an 8 KiB prompt),
// and a record sent already within the interval (the same checkpoints for the same engine) is not sent
// again; messages are at most 32 KiB plus one record. A load message is at most 256 providers, 64 KiB.
// With a key, the envelope adds 25 bytes to each message.
//
// Memory: the table is 16 bytes x max_entries rounded up to a power of two (16 MiB by default), whatever
// is received (TestEvidenceFlood sends 1.6M checkpoints into 4096 slots and watches the heap); the queue
// is 784 bytes x queue_size (3.1 MiB by default), the batch 33 KiB, the peers' loads at most max_peers (64
// by default) x this gateway's own provider names. Decoding allocates nothing for evidence and never in proportion to a
// length a message claims: a message is checked whole (version, every record's count and length) before
// any of it is used, so a truncated, garbage, oversized or other-version message is dropped whole and
// counted as malformed (FuzzDecode).
//
// # NATS down
//
// Start does not wait for NATS. Without it each replica routes on its own evidence and on the peers'
// evidence it already holds (until its TTL), and the peers' in-flight counts expire within a second or
// three intervals. nats.go reconnects every 500 ms (+-100 ms), forever; the connection is dialled through
// the egress policy (egress.Dialer: resolved once, every address checked). Connects, disconnects and
// reconnects are logged once per transition, not per attempt or message, and rolter_cluster_connected
// says which state a replica is in.
//
// # Metrics
//
//	rolter_cluster_connected                              gauge 0/1
//	rolter_cluster_peers                                  peer replicas heard from recently
//	rolter_cluster_evidence_entries                       table slots ever filled (at most its size)
//	rolter_cluster_messages_total{kind,direction}         evidence | load, sent | received
//	rolter_cluster_dropped_total{reason}                  queue_full (records), malformed, publish_failed,
//	                                                      slow_consumer (messages)
//	rolter_cluster_refused_total{reason}                  unauthenticated, bad_mac, stale, replayed,
//	                                                      too_many_peers, rate_limited (messages),
//	                                                      inflight_capped (claims cut to their cap)
//
// # Cost
//
// On a 2-vCPU VM (cluster_timing_test.go): Held over 8 engines x 32 checkpoints on a full 2^20-slot
// table, 293 ns per request (37 ns per engine; BenchmarkHeld); Routed of a 96-checkpoint key, 60 ns
// (BenchmarkRouted/queued), 16 ns when the queue is full; the publisher, 148 ns per record
// (BenchmarkFlushEvidence); applying a received 32 KiB message, 35-45 ns per checkpoint
// (BenchmarkApplyEvidence). With a key, verifying a 32 KiB message's envelope is one SHA-256 pass: 30 us
// here, against 786 us to apply it, both measured while other work shared the 2 vCPUs (BenchmarkOpenEnvelope;
// the bare path measured the same before and after the envelopes came). None of them allocates
// (allocation_test.go).
package cluster
