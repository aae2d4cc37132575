// Package kvindex turns vLLM KV-cache events into an exact, lock-free-to-read index of which prompt blocks
// each target (engine replica) holds on its GPU, for the precise_cache_aware strategy.
//
// # Design
//
//	ZMQ SUB (Subscriber reader, one goroutine per socket, cgo; a bind endpoint's targets share one,
//	         each message routed by its topic frame)
//	  -> msgQueue   bounded in messages and bytes; a drop is a gap       (per target)
//	  -> Stream     sequence checks, trust, replay / clear recovery      (per target applier goroutine, pure Go)
//	  -> Decoder    msgpack batch -> Handler callbacks, zero allocation  (per target)
//	  -> TargetIndex engine hash -> own key, LRU cap, counters           (per target, one writer)
//	  -> Index      own key -> uint64 bitmask of targets                  (shared, lock-free readers)
//	Index.Match(tokens) walks the request's blocks once for all targets.
//
// Own keys. vLLM's block hashes depend on PYTHONHASHSEED, the hash algorithm and the vLLM version, and are
// random per process by default (vllm/v1/core/kv_cache_utils.py), so the index never uses them as keys.
// Every BlockStored event carries the blocks' token ids; the index keys a block by its own chain
// key_i = xxhash64(key_{i-1} as 8 little-endian bytes ++ the block's token ids as 4 little-endian bytes
// each), key_{-1} = RootKey, full blocks only (BlockKeys). The request path computes the same keys from the
// token ids it is given. Per target, engine hash -> own key is kept to apply BlockRemoved and to chain a
// stored block from its parent. Keys cover token ids only: LoRA, cache_salt and multimodal extra keys are
// not part of them, so the same tokens under two salts share a key (the target's bit stays until its last
// such block goes).
//
// Residency. One table for all targets maps own key -> bitmask (bit t = target t holds the block on the
// GPU): a sharded open-addressing table of 8-byte words in 16-byte cells, one word for a key one target
// holds (key and target), a cell for a key several hold (key and mask), whose readers take no locks and
// never see a torn entry (see residency in table.go), so Match does one probe per block for up to 64
// targets and stops at the first block no remaining target holds. Each target keeps its blocks in a slab of
// 16-byte records (engine hash, own key) in store order, which is LRU order (capped at max_blocks; evicting
// clears the target's bit; a block stored again or removed leaves a dead record, compacted away once dead
// records outnumber a quarter of the live ones), and a 4-byte-slot table from engine hash to record.
//
// Memory, measured by BenchmarkIndexMemory (16 targets x 30k, 45k, 60k and 90k blocks, all structures
// included; the tables grow in steps): 30.6 to 31.3 bytes per (block, target) entry when every target holds
// distinct blocks (at 60k: 16.1 for records, 4.5 for the engine-hash table, 10.6 for the shared table),
// 21.7 to 22.9 when targets share their blocks (a common prefix: the shared table's key is split between
// them), 35.9 to 36.9 after as many random removals and stores as blocks (dead records, tombstones). Issue
// 19 cut them from 52.8 to 56.6, 30.9 to 31.9 and 58.4 to 61.1 (LRU links, 16-byte slots for every key,
// lower loads); TestIndexMemory fails above 36 and 27 for the first two. The shared table alone costs 10 bytes per key one target
// holds against 48.5 for xsync.MapOf[uint64, uint64] (BenchmarkResidencyMemory).
//
// # Wire formats accepted
//
// A ZMQ message is three frames: topic, sequence (8-byte big-endian, 0 for vLLM's first batch, 1 for
// llm-d-inference-sim's), msgpack payload. Anything else is a garbage frame: counted, ignored.
//
// The payload is a batch, positional [ts, events] or [ts, events, data_parallel_rank] (rank may be nil;
// further trailing elements are skipped), or a map {ts, events, data_parallel_rank} in any key order.
// Events are tagged arrays ["BlockStored", fields...] or tagged maps {"type": "BlockStored", ...}:
//
//	era (vLLM PR)                    batch    BlockStored    BlockRemoved  AllBlocksCleared
//	#16750 (2025-04)                 array 2  array 6        array 2       array 1
//	#18925 data_parallel_rank        array 3  6              2             1
//	#19737 medium                    3        7              3             1
//	#27577 lora_name                 3        8              3             1
//	#33304 extra_keys                3        9              3             1
//	#37688 group_idx                 3        10             4             1
//	#40984 kv_cache_spec kind/window 3        12             4             1
//	#42892 (2026-06) map events      3        map 8-12 keys  map 2-4 keys  map {"type"}
//	llm-d-inference-sim              3        array 9, or map without lora_id/lora_name
//
// Positional events need at least the fields up to block_size (BlockStored) or block_hashes
// (BlockRemoved); missing trailing fields are nil, unknown trailing fields are skipped, and the newer
// optional fields (group_idx, kv_cache_spec_*) are skipped as absent when their type does not fit (one
// unmerged vLLM copy inserts event_version before extra_keys). Map events may order keys freely; unknown
// keys are skipped. Unknown event types are skipped and counted (Batch.Skipped). Block hashes may be any
// msgpack integer (uint64 as vLLM sends digests' low 64 bits, negative int64 from the builtin-hash era,
// reinterpreted) or bin (the raw digest with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0, folded to its last 8
// bytes big-endian, left-padded when shorter: llm-d's rule, equal to vLLM's integer form). A parent hash of
// nil (vLLM) or 0 (llm-d-inference-sim) means "first block". Token ids and sizes may use any integer width.
// Only medium nil or "GPU" (any case) counts as resident; CPU/STORAGE offload events are ignored.
//
// Malformed payloads return an error and deliver no event: Decode validates the whole batch before the
// first callback, checks every array and map header against the bytes left, and never panics
// (FuzzDecode). Its scratch is bounded too: one batch may decode into at most 32 MiB (maxBatchScratch;
// a 128k-token prefill needs 576 KiB), a batch that needs more is malformed, one that used more than 4 MiB
// lets it go afterwards, and values of unknown fields are skipped without recursion at any depth
// (TestDecodeScratchBudget, TestDecodeHugeDeclaredLengths, TestDecodeDeepNesting).
//
// # Trust
//
// A Stream publishes its target's trust as a state and a reason (Stream.Trust: one atomic load, read per
// request and target). Routing scores only exact evidence; a target in either other state is
// scored by its other evidence (the gateway's approximate trie, then load):
//
//   - exact: the index holds what the engine's cache holds, as far as the events tell. After one of the
//     index's own clears it can only under-report (blocks stored before the clear are unknown), never
//     report a block the engine dropped.
//   - degraded: events may be missing and recovery is under way: a replay runs, or the next batch settles
//     a doubt. The index is kept but not scored.
//   - fallback: the index is not evidence: nothing received yet, silence, or events lost with nothing to
//     recover them (the index was cleared). It waits for the publisher.
//
// Transitions (state/reason; "cleared" below means the index's own Clear, counted in Clears):
//
//	start                              fallback/no_events_yet
//	first batch, at the publisher's    exact/ (a late joiner is not a gap; vLLM numbers from 0,
//	  first sequence or later            llm-d-inference-sim from 1)
//	  ... with a replay endpoint       degraded/replaying while the publisher's buffer is replayed
//	                                     into the index, then exact/ (whether or not the replay worked:
//	                                     it only makes a late joiner's index fuller)
//	next sequence (contiguous)         exact/ (from any state: after a clear the index is consistent)
//	forward jump (gap)                 degraded/gap, then
//	  with a replay endpoint           degraded/replaying -> exact/ when the replay filled the gap,
//	                                     fallback/gap (cleared) when it failed
//	  without                          fallback/gap (cleared); exact/ at the next contiguous batch
//	sequence goes back                 fallback/publisher_restart (cleared), then
//	  (publisher restart)                exact/ at once when the new sequence is the publisher's first;
//	                                     else with a replay endpoint degraded/replaying -> exact/ (replayed
//	                                     from 0) or fallback/publisher_restart; without, fallback until the
//	                                     next contiguous batch
//	AllBlocksCleared                   exact/cleared (the index empties with the engine's cache), exact/
//	                                     once a block is stored again
//	payload that does not decode,      fallback/mismatch (cleared); exact/ at the next contiguous batch
//	  or an unknown parent that
//	  proves missed events
//	no batch for stale_secs            fallback/stale (nothing cleared); the next batch decides as above
//	implausible jump (> 2^20 ahead),   degraded/gap (nothing cleared); the next batch decides
//	  or batches the queue dropped
//	gateway: engine restarted          engine_restart: reserved for the gateway's scraper; never set here
//
// Why cleared is exact, not degraded: AllBlocksCleared is the engine saying its cache is empty
// (reset_prefix_cache, sleep), and the emptied index says the same: "nothing resident" is the truth, the
// most exact evidence there is. Degraded would hand the target to its approximate trie, which still holds
// the prefixes the engine just dropped: the stale evidence this state machine exists to avoid. The reason
// stays "cleared" until the engine stores a block, so operators (and the gateway, which may reset that
// target's trie on it) see why the target matches nothing. A batch holding AllBlocksCleared makes the index
// exact at once whatever was lost before it: from that event on the index has seen everything the engine's
// cache went through.
//
// Details. A sequence jump of more than 2^20 batches (maxSeqJump) is not taken for a gap: it is counted and
// ignored, the target degraded until the next message, exact again (nothing cleared) if the publisher goes
// on from the last sequence, cleared like an unreplayable gap if the next message follows the implausible
// one (see Stream.Handle). When the subscriber's queue was full and dropped batches (see Exposure) the
// applier meets a marker at their place and the target is degraded at once; the next batch settles it as
// a sequence would. A restart first seen at a sequence above the last run's last one (a run shorter than
// the batches the new one lost before the gateway reconnected) looks like a gap and is handled as one: the
// sequence alone cannot tell them apart, and the old run's blocks stay until evicted, removed, or cleared
// by a mismatch (the new run's blocks chain from parents the index never saw); the gateway's engine_restart
// signal (its scraper sees a new process) is what catches that case. An unknown parent proves missed events only while the index has
// seen the engine's cache from empty (since the publisher's first batch or AllBlocksCleared); after one of
// its own clears, orphans are expected and ignored. Stream.Trusted is Trust == exact; StreamStats carries
// Trust, Reason and Trusted from one load.
//
// # One bind endpoint for many engines
//
// llm-d deploys one subscriber that every engine connects to, the topic frame naming the engine
// (kv@<pod-ip>:<port>@<model>). In bind mode, targets whose SubscriberConfig names the same endpoint share
// one SUB socket when their socket settings agree (SameSocket: max_message_bytes and the publisher policy,
// which admit a connection before any topic is seen): the socket subscribes to every target's topic and its
// reader routes each message to the targets whose topic is the longest prefix of the message's (the SUB's
// own rule is a prefix match; the longest one tells kv@10.0.0.1 from kv@10.0.0.11). Each target keeps its
// own queue, applier, Stream (sequence, trust, replay endpoint, staleness) and index. Adding a target to a
// shared socket subscribes its topic; removing one unsubscribes it, and the socket closes with its last
// target, so a reload that adds or removes one provider leaves the others' connections and streams alone.
// Two targets with the same topic both receive (a reload that replaces a provider's subscription keeps the
// old one fed until it drains). A target whose socket settings differ from those of the socket holding its
// endpoint (a reload that changes allowed_publishers) gets a socket of its own, which retries its bind
// until the old socket closes and is woken when it does. The publishers of one shared endpoint cannot be
// told apart before their first message, so the socket-level counters (Disconnects, AuthRefused) are the
// socket's, shown in each of its targets' stats.
//
// BindConflicts checks a whole config: every target of a shared endpoint needs a distinct non-empty topic
// (an empty one would take every engine's messages), the same socket settings, and two endpoints written
// differently must not bind one port (tcp://*:5557 and tcp://10.0.0.5:5557: the second would retry
// "address already in use" forever). vLLM sets its topic with --kv-events-config '{"enable_kv_cache_events":
// true, "publisher": "zmq", "endpoint": "tcp://<gateway>:5557", "topic": "kv@vllm-1"}' (an endpoint without
// "*" or "::" makes vLLM's PUB connect); llm-d-inference-sim sets kv@<POD_IP>:<port>@<model> itself.
//
// # Exposure
//
// The index believes what it receives. vLLM publishes with ZMQ's NULL mechanism (no authentication, no
// encryption), so a peer that reaches a bound SUB (bind mode) or that answers at the endpoint (connect
// mode) publishes batches the index takes as the engine's: it can make a target untrusted at will (a forged
// gap or restart clears it) or plant blocks that draw requests to it until the next clear. Who can publish
// is therefore decided by the network, or, in bind mode, by a publisher policy; see "Publishers" below.
// Against a peer that does get through, the subscriber guarantees bounded memory and counters that stay
// meaningful, no more:
//
//   - Frames. The SUB and the replay DEALER accept frames up to MaxMessageBytes (default 16 MiB; the
//     arithmetic is at DefaultMaxMessageBytes). libzmq checks a frame's announced size before allocating
//     it and disconnects a peer that announces more (before, one 300 MiB frame cost 900 MB). It does not
//     say why it disconnected, so such frames are not counted as such: they show as Disconnects and then
//     as a sequence gap. libzmq reconnects a connecting socket after a connection error but not after this
//     protocol error (libzmq 4.3: the SUB stayed silent for good), so in connect mode the subscriber
//     reopens its socket whenever it loses the publisher; in bind mode the engine reconnects by itself.
//   - Messages. ZMQ_MAXMSGSIZE bounds each frame, not a message, and libzmq buffers a multipart message
//     whole before its first frame can be read: one message of many frames, each under the limit, makes
//     libzmq hold them all (300 frames of 1 MiB: 830 MB resident, measured with libzmq 4.3.4). No socket
//     option bounds that. The subscriber receives frame by frame and drops any frame past the third (the
//     fourth for a replay reply) as it comes, so it adds at most that many to what libzmq holds. Likewise
//     in bind mode nothing limits the number of peers, each holding a frame in progress; libzmq's
//     heartbeat timeout (15 s without a complete frame) closes a peer that trickles one, so what they
//     hold is bounded by the bandwidth they spend.
//   - Queue. The reader goroutine only drains the socket into a queue to the applier goroutine, bounded
//     by MaxQueueBytes (default 64 MiB, counting each message's payload plus 256 bytes) and by 100,000
//     messages (vLLM's own PUB buffer); libzmq's queue in front of it holds 16 messages. A message that
//     does not fit is dropped and counted (QueueDrops), and the applier meets a marker at its place: the
//     target is degraded at once, like at a sequence gap, and the next batch settles it. Memory per
//     target is at most MaxQueueBytes + MaxMessageBytes (the batch being applied) + 17 x MaxMessageBytes
//     inside libzmq, the last only while the reader is descheduled (then TCP pushes back on the publisher).
//   - Sequence numbers. A jump of more than 2^20 batches is counted in ImplausibleJumps, never in
//     LostBatches (one forged sequence near 2^64 made LostBatches 1.8e19); a plausible forged jump still
//     adds at most 2^20. The stream returns to the real publisher's sequence by itself (Stream.Handle).
//   - Payloads. See the last paragraph of "Wire formats accepted".
//
// # Publishers
//
// Connect mode (vLLM's default: the engine's PUB binds tcp://*:5557, the gateway connects) admits nobody:
// the gateway dials the endpoint it was given and believes whatever answers there. Its endpoint and
// replay_endpoint (in either mode: vLLM's replay ROUTER always binds) are checked by the gateway's egress
// policy, not here, and SubscriberConfig.Validate refuses a publisher policy in connect mode.
//
// Bind mode (llm-d style: the gateway's SUB binds, the engines connect; vLLM connects when its tcp://
// endpoint has neither "*" nor "::", vllm/distributed/kv_events.py) accepts a connection from any peer that reaches the port,
// on every interface the endpoint names (tcp://*:5557: all of them), and by default believes it. A
// bind-mode target can set a publisher policy (SubscriberConfig; [providers.kv_events] keys in brackets):
//
//   - Allow-list [allowed_publishers]: IP addresses and CIDR prefixes, IPv4 and IPv6. A connection from any
//     other address is refused during the handshake, before its first message. An IPv6 literal endpoint
//     (tcp://[::]:5557) binds with ZMQ_IPV6 and is then dual-stack; its IPv4 peers (::ffff:a.b.c.d) count
//     as their IPv4 address. The address says where the TCP connection comes from, not who is behind it:
//     every process on an allowed host passes (every pod of a node's host network, say), and so does
//     anyone who can take an allowed address over on the local network.
//   - CURVE [curve_secret_key, curve_client_keys]: the socket is a CURVE server (ZMQ RFC 26). Connections
//     are authenticated by key and encrypted (the events carry the prompts' token ids); NULL connections
//     are refused, and so is a client key not in the list. Generate key pairs with zmq.NewCurveKeypair
//     (pebbe/zmq4), zmq.curve_keypair() (pyzmq) or libzmq's curve_keygen tool: one for the gateway (its
//     secret key here, best kept out of the config file), one per engine (its public key in the list). An
//     engine needs the gateway's public key (CurvePublicKey derives it from the secret) as its
//     ZMQ_CURVE_SERVERKEY and its own pair as ZMQ_CURVE_PUBLICKEY/SECRETKEY. vLLM's ZmqEventPublisher sets
//     no security option, so stock vLLM cannot do CURVE: it needs a publisher that can (a patched one, or a
//     relay beside the engine that subscribes on localhost and publishes to the gateway with CURVE).
//   - With both, a publisher needs an allowed address and an allowed key.
//
// How. Each such socket sets its own ZAP domain (so each has its own allow-list; the targets of a shared
// bind endpoint share their socket's, which is why they must all set the same), and libzmq asks the
// Subscriber's ZAP handler (ZMQ RFC 27) about every connection: one goroutine with a REP socket bound to
// inproc://zeromq.zap.01 in the Subscriber's own zmq context, started with the first socket that has a
// policy and stopped after the last socket closed (pebbe/zmq4's AuthStart is process-global, bound to
// the default context, and panics on unexpected requests). It answers every request, malformed ones with
// 500 (Subscriber.AuthErrors), and never panics (TestZAPHandlerMalformed). libzmq 4.3 admits every peer of
// a socket with a ZAP domain when no handler is bound (ZMQ_ZAP_ENFORCE_DOMAIN, which would refuse them, is
// a draft option), so the handler is bound before the first such socket binds and a socket whose handler
// failed to start does not bind at all.
//
// Refusals are counted per socket, in each of its targets (StreamStats.AuthRefused: every failed handshake
// on a socket with a policy), and logged at most every 30 seconds per socket, with the address and the reason for those the
// handler refused. A libzmq 4.3 publisher does not reconnect after its handshake was refused (one with the
// wrong server key excepted): after widening allowed_publishers or adding a key, restart the publisher of
// every engine that was refused. A refused peer never sends a message, but it can open connections: each
// costs a handshake, which libzmq abandons after ZMQ_HANDSHAKE_IVL (30 s).
//
// On a shared network (other tenants, or hosts you do not control, can reach the gateway or the engines):
//
//  1. Prefer connect mode with the endpoints under the gateway's egress policy: the gateway then listens
//     on no KV-event port at all. Firewall the engines' PUB and replay ports to the gateway: vLLM serves its
//     events, the prompts' token ids included, to anyone who connects, and replays them on request.
//  2. In bind mode, bind to a private interface (tcp://10.0.0.5:5557, never tcp://*:5557 on a host with a
//     public one) and set allowed_publishers to the engines' addresses.
//  3. Where addresses prove nothing (a flat network shared with others, a host network shared by many
//     pods), use CURVE, which authenticates each engine by key and encrypts the events; with
//     allowed_publishers as well if the engines' addresses are known.
//
// # Metrics
//
// Stream.Stats returns a StreamStats snapshot (atomic loads, safe from any goroutine) for the metrics
// layer: batches, gaps and lost batches, restarts, replays ok/failed, decode errors, garbage frames, stale
// transitions, skipped (unknown) events, missed-event incidents, implausible sequence jumps, queue drops,
// publisher disconnects, refused publisher connections (AuthRefused), last sequence, trust state, reason
// and trusted; and, from the target's TargetStats: events by kind (stored, removed, cleared), blocks stored/removed, LRU
// evictions, unknown parents, unknown removes, token-count and block-size mismatches, non-GPU events,
// rekeys, clears, resident blocks, learned block size and the target's own bytes. Index.Stats gives the
// shared table's distinct keys and bytes.
//
// # Concurrency
//
// Index.Match is safe for concurrent use and never blocks writers; its Scratch is per goroutine. A
// TargetIndex, its Stream and its Decoder are written by one goroutine (the Subscriber's applier, or the
// caller's when feeding a Stream directly); their Stats, Trust, Trusted, Reason, Blocks and BlockSize are
// safe from any goroutine. The Subscriber needs cgo and libzmq (github.com/pebbe/zmq4); without cgo NewSubscriber
// returns ErrNoCgo and everything else works.
package kvindex
