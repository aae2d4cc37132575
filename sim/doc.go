// Package sim is a simulated vLLM engine: a real HTTP server (fasthttp) and a real ZMQ KV event
// publisher (pebbe/zmq4, cgo) that behave like one vLLM replica closely enough to test and
// benchmark cache-aware routing on one machine. It is the upstream of `rolter sim`,
// `rolter up`, the tests and the benchmarks.
//
// # Model
//
// Tokenizer. AppendTokens cuts text left to right into pieces of at most 4 bytes, whitespace
// going with the word after it, and maps each piece to 100 + FNV-1a mod 32000. It is
// deterministic and prefix-stable, at roughly 3-4 bytes per token. AppendChatTokens is the chat
// template: <im_start> role <role_end> content <im_end> per message (markers are reserved ids
// 2, 4, 3), and the generation prompt <im_start> "assistant" <role_end>, so each turn of a
// conversation is a token prefix of the next. /tokenize, /v1/completions and
// /v1/chat/completions all use these, so ids from /tokenize are the ids the cache holds.
//
// Prefix cache. Full blocks of BlockSize tokens, named by vLLM's sha256_cbor chain
// (NONE_HASH = sha256(cbor("0")), as with PYTHONHASHSEED=0; block = sha256(cbor([parent digest,
// [tokens], None]))), NumBlocks of capacity. A request pins the cached blocks it hits and
// reserves private blocks for the rest of its prompt and all its output tokens; after prefill
// its new full prompt blocks become cached (BlockStored). Cached blocks nobody pins form an LRU
// list, evicted when room is needed (one BlockRemoved per block); a request releases its blocks
// last block first, so a sequence's tail goes before its parents, as in vLLM's free queue. As
// in vLLM, a prompt always computes its last token, so a prompt of exactly k full blocks hits at
// most k-1 (cached_tokens = hit blocks x BlockSize). Generated tokens are not cached. A block
// another request cached meanwhile is adopted, not stored twice.
//
// Scheduler and latency. At most MaxNumSeqs requests run; the rest wait in FIFO order, also
// while the cache cannot give a request its blocks. A running request's first token comes
// after (uncached prompt tokens x PrefillPerToken), the next ones every DecodePerToken; the
// output is filler words, MaxTokens of them unless the request sets max_tokens or
// max_completion_tokens (finish_reason "length" then, "stop" otherwise). Waiting uses timers;
// a waiting or running request whose client closed the connection is dropped and frees its
// slot (the socket is peeked every 20ms on Linux; streams also notice failed writes).
//
// # Disaggregated prefill and decode (Config.Role)
//
// As vLLM with the NixlConnector (vllm/distributed/kv_transfer/kv_connector/v1/nixl, driven by a
// proxy like tests/v1/kv_connector/nixl_integration/toy_proxy_server.py or llm-d's routing
// sidecar). Roles: "" (aggregated: kv_transfer_params are ignored), "prefill" (kv_producer),
// "decode" (kv_consumer), "both" (kv_both: either part, as each request's params say). Only
// /v1/completions and /v1/chat/completions read kv_transfer_params; a field of the wrong type is
// a 400.
//
// Prefill. A request with kv_transfer_params.do_remote_decode true runs as any request (prefix
// cache, prefill latency, max_tokens: the proxy sends 1) and its non-stream answer ends with
//
//	"kv_transfer_params": {"do_remote_prefill": true, "do_remote_decode": false,
//	  "remote_block_ids": [ids of the prompt's full blocks], "remote_engine_id": EngineID,
//	  "remote_request_id": "<id>-<n>", "remote_host": SideChannelHost, "remote_port": side
//	  channel port, "tp_size": 1, "remote_num_tokens": prompt tokens}
//
// Its blocks (full, partial and output) stay held, counted in kv_cache_usage_perc, until a
// decode engine pulls them or KVLease passes (default 480s, VLLM_NIXL_ABORT_REQUEST_TIMEOUT;
// newer vLLM uses a 30s kv_lease_duration renewed by the decode side's heartbeats); then they
// are freed unread (vllm:nixl_num_kv_expired_reqs). A prompt shorter than a block offers [] and
// holds nothing. A stream with do_remote_decode holds too (its events carry no
// kv_transfer_params); a request whose client left frees at once, as an abort does in vLLM.
//
// Side channel (sidechannel.go), an HTTP listener of its own on Host:SideChannelPort standing
// in for NIXL's handshake, read and notification: POST /pull {"engine_id", "request_id",
// "block_ids"} takes TransferPerBlock per block named, frees the request's whole hold and
// answers {"block_hashes": [hex digests]}; an unknown engine id, block or request (never
// prefilled, already pulled, expired) is a 4xx {"error"} that frees nothing.
//
// Decode (pull.go). A request with do_remote_prefill true, remote_block_ids and the remote_*
// fields pulls the tail of remote_block_ids its local prefix cache lacks (as vLLM's worker
// reads only the unhashed blocks; an empty pull still frees the prefill side), checks the
// digests against its own prompt, then runs: the read blocks count as cached (stored in its
// cache with BlockStored after prefill), the last prompt token is always computed, so a fully
// read prompt reports cached_tokens = prompt_tokens - 1 (vLLM's _update_waiting_for_remote_kv).
// vllm:prefix_cache_* count local hits only, vllm:external_prefix_cache_* the read tokens. The
// sim offers and reads full blocks only: newer vLLM also moves the partial last block, with
// the same cached_tokens. Params lacking a remote_* field, or with no block ids, are served
// without a transfer (vLLM: "invalid KVTransferParams"). A failed pull (prefill engine gone,
// blocks expired or pulled already, wrong engine id, garbage answer, digests of another
// prompt) counts in vllm:nixl_num_failed_transfers and, under KVLoadFailure "fail" (vLLM's
// kv_load_failure_policy default), answers HTTP 500 InternalServerError (in a stream: one
// error event, then [DONE]); under "recompute" the prompt is computed locally. An empty pull
// that fails (a full local hit) is a failed notification (vllm:nixl_num_failed_notifications)
// and the request runs. Successful pulls feed vllm:nixl_xfer_time_seconds. Stats counts
// RemotePrefills, HeldBlocks, PullsServed, PullsRefused, BlocksSent, ExpiredReqs,
// ExpiredBlocks, RemoteDecodes, PullsFailed, FailedNotifs and BlocksReceived.
//
// # SGLang's protocol: one room, two requests at once (bootstrap.go, room.go, fetch.go)
//
// A /v1/completions or /v1/chat/completions body with "bootstrap_room" on an engine with a Role
// speaks SGLang's protocol instead of vLLM's (kv_transfer_params are then ignored). SGLang's
// routers (python/sglang/srt/disaggregation/mini_lb.py, sgl-model-gateway's PD router) send the
// same body to a prefill and a decode engine at once, adding "bootstrap_host" (the prefill's
// host), "bootstrap_port" (its bootstrap port, or null) and "bootstrap_room" (an integer, the same
// on both, new per client request). The facts the sim follows, from SGLang's sources:
//
//   - The prefill server generates one token whatever max_tokens says (disaggregation/prefill.py,
//     PrefillBootstrapQueue._process_req sets max_new_tokens 1), ends it FINISH_LENGTH and answers
//     only after the transfer to the decode succeeded (process_disagg_prefill_inflight_queue:
//     KVPoll.Success, then stream_output), so its answer follows the decode's read. stream is
//     honoured: headers at once, the token event after the transfer. Its usage is that of a
//     one-token request, cached_tokens its own prefix hit.
//   - SGLang's prefill waits for its decode up to SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT (300s,
//     srt/environ.py) and fails the request with HTTP 500 ("Prefill bootstrap failed"); the decode
//     waits for the KV up to SGLANG_DISAGGREGATION_WAITING_TIMEOUT (300s): "Request N timed out
//     after Xs in KVPoll.WaitingForInput" (the backends' KVReceiver.poll), then
//     DecodeTransferQueue.pop_transferred aborts it with HTTP 500 ("Decode transfer failed").
//   - The decode takes usage's cached_tokens from the prefill engine, shipped with the KV
//     (decode.py _commit_transfer_to_req; sgl-project/sglang#25972), not the transferred prefix.
//   - A null bootstrap_port means the engine's own --disaggregation-bootstrap-port (8998 by default;
//     managers/scheduler.py handle_generate_request). A null bootstrap_room on a disaggregated
//     engine is a 400 "Disaggregated request received without bootstrap room id" (the scheduler's
//     check), a member of the wrong type a 400 from SGLang's RequestValidationError handler
//     (http_server.py turns FastAPI's 422 into 400). Errors use SGLang's ErrorResponse
//     {"object":"error","message","type","param":null,"code"} (entrypoints/openai/protocol.py);
//     an aborted request's 500 has type "500" (serving_base.py: HTTPException ->
//     create_error_response(err_type=str(status_code))).
//   - A client that leaves aborts its request; an aborted decode receiver tells the prefill
//     (_send_abort_notification in the backends' conn.py), whose request then fails.
//
// The sim: a prefill engine runs the request (prefix cache, prefill latency, one token), keeps its
// full prompt blocks under the room, and answers once a decode engine has read them; after
// BootstrapTimeout (--bootstrap-timeout-seconds, 300) unread they are freed and it answers 500
// (sglang:num_bootstrap_failed_reqs). A decode engine asks the prefill's side channel, which is
// the bootstrap server (its port is the bootstrap port): POST /room {"room", "start", "wait_ms"}
// long-polls up to a second for the room, then takes TransferPerBlock per block sent from
// "start" (the blocks the decode lacks) and answers their digests and the prefill's
// cached_tokens; the decode checks the digests against its own prompt (another body is a 500),
// caches the blocks and decodes max_tokens tokens. It asks again until WaitingTimeout
// (--waiting-timeout-seconds, 300) passes, then answers 500, in a stream one error event then
// [DONE] (sglang:num_transfer_failed_reqs). A decode whose client leaves sends POST /room/abort:
// a held room is freed and its prefill answers 500; a room not held yet gets a tombstone for
// BootstrapTimeout, so its prefill fails at once. A prefill whose client leaves frees its room.
// The sim moves full blocks only: the prompt's tail shorter than a block is computed on the
// decode (PrefillPerToken each). Simplifications: SGLang's prefill does not compute
// before the decode has registered with it (the sim prefills at once); the sim takes integers only
// as JSON integers where pydantic's lax mode also takes "7" or 7.0; lists (batched /generate)
// and Role both are refused with 400. Stats counts RoomsServed, RoomsExpired, RoomsAborted,
// RoomDecodes and RoomsFailed; /metrics adds rolter_sim_bootstrap_rooms_served_total and
// rolter_sim_bootstrap_rooms_aborted_total.
//
// # LoRA adapters (Config.EnableLoRA; lora.go, loraapi.go)
//
// As vLLM with --enable-lora (vllm/entrypoints/openai/serving_models.py, the v1 scheduler,
// LRUCacheWorkerLoRAManager, v1/metrics/loggers.py). The registry holds the adapters requests
// may name: LoRAModules (--lora-modules name=path …) and, with AllowRuntimeLoRA
// (--allow-runtime-lora or VLLM_ALLOW_RUNTIME_LORA_UPDATING=True/1), those added by
//
//	POST /v1/load_lora_adapter {"lora_name","lora_path"}  takes LoRALoadDelay (vLLM's add_lora
//	     loads before answering), then 200 text "Success: LoRA adapter '<name>' added
//	     successfully."; a missing field or a registered name is a 400 InvalidUserInput
//	POST /v1/unload_lora_adapter {"lora_name"}  200 "Success: LoRA adapter '<name>' removed
//	     successfully.", an unknown name a 404 NotFoundError ("… cannot be found.")
//
// Without runtime updating both paths are FastAPI's 404. GET /v1/models lists the base model,
// then one card per adapter in registration order (root: its path, parent: the base model,
// max_model_len: null). A completion, chat, Responses, Messages, embeddings or /tokenize body
// whose "model" is an adapter runs with it, and answers carry the adapter's name as "model";
// any other name is the 404 of an unknown model (always, without EnableLoRA). Adapters get
// lora_int_id 1, 2, … as they are registered.
//
// GPU slots. At most MaxLoRAs (--max-loras, 1) adapters are loaded at once. A request whose
// adapter is loaded runs as any; one whose adapter is not takes a free slot, or evicts the least
// recently used loaded adapter no running request uses, and its prefill starts LoRALoadDelay
// (--lora-load-ms, 100) later; requests of that adapter admitted during the load wait for the
// same load. When every slot's adapter has running requests the request waits (it counts in
// num_requests_waiting) and the scheduler looks at the requests behind it, as vLLM's skips
// requests whose adapter would exceed max_loras; base-model requests never need a slot. So that
// a busy adapter cannot keep a waiting one out for ever, the first held-back request makes the
// least recently used slot drain: new requests of its adapter wait until it has been evicted
// (vLLM has no such rule). A client that leaves while waiting frees its place. An unloaded
// adapter leaves its slot when its last running request ends. MaxCPULoRAs (--max-cpu-loras) is
// accepted, not modelled.
//
// Prefix cache and events. vLLM puts the adapter's name in every block's extra keys, so a block
// of an adapter is sha256(cbor([parent, [tokens], [lora_name]])): adapters never share blocks
// with the base model or each other. BlockStored events of such blocks carry lora_id (the int
// id), lora_name and extra_keys [[lora_name], …] in the eras that have those fields.
//
// Metrics. vllm:lora_requests_info{max_lora,waiting_lora_adapters,running_lora_adapters} is a
// gauge set to the scrape's unix time for the current label set (adapters with waiting or
// running requests, comma-joined in registration order); as with prometheus_client, series of
// earlier label sets stay with their older times (the latest 16), so a reader takes the one with
// the largest value. rolter_sim_lora_loads_total and rolter_sim_lora_evictions_total count slot
// loads and evictions. Stats counts LoRALoads, LoRAEvictions, LoRAAPILoads, LoRAAPIUnloads and
// LoRASlots.
//
// # HTTP (vLLM's OpenAI server shapes)
//
//	POST /v1/chat/completions, /v1/completions   JSON or SSE ("data: {...}\n\n" per event, one
//	                                             flush each, "data: [DONE]\n\n" last;
//	                                             stream_options.include_usage adds a usage
//	                                             event with "choices": [] before [DONE])
//	POST /v1/responses    OpenAI's Responses API (responses.go): input and instructions under the
//	                      chat template; SSE of its typed events (event: + data:), no [DONE]
//	POST /v1/messages     Anthropic's Messages API (messages.go): system and messages under the chat
//	                      template, max_tokens required; Anthropic's events and error shape
//	POST /v1/embeddings   one L2-normalised vector per input, floats or base64 (embeddings.go)
//	POST /tokenize        {"model","prompt"} or {"model","messages","add_generation_prompt"}
//	                      -> {"count","max_model_len","tokens","token_strs":null}
//	GET  /v1/models, /health, /version
//	POST /v1/load_lora_adapter, /v1/unload_lora_adapter   with AllowRuntimeLoRA (see above)
//	GET  /metrics         prometheus_client text (see below)
//	GET  /lmcache/status  {"occupancy": cached blocks / NumBlocks, "cache_available": bool}
//
// usage carries prompt_tokens, completion_tokens, total_tokens and
// prompt_tokens_details.cached_tokens. Errors use vLLM's shape
// {"error":{"message","type","param":null,"code"}}: 404 NotFoundError for an unknown model,
// 400 BadRequestError for bad JSON or values (including prompt + max_tokens over
// max_model_len), 500 InternalServerError for injected faults. Unknown paths answer FastAPI's
// {"detail":"Not Found"}. The X-Request-Id header is echoed and becomes the response id
// ("chatcmpl-<id>"), as vLLM does. The prompt of /v1/completions may be a string, token ids, or
// a list holding one of those.
//
// # Metrics
//
// vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc (blocks held
// by running requests / NumBlocks, as vLLM counts unpinned cached blocks as free),
// vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total (tokens, with *_created
// families), vllm:cache_config_info, with EnableLoRA the LoRA families above and, with a Role, the KV connector's families above, labelled engine (EngineLabel) and model_name, with
// # HELP / # TYPE lines and Python-style floats like prometheus_client (docs/internals/engine-metrics.md; test vector TV9).
//
// # KV events
//
// As vLLM's ZmqEventPublisher: three frames [topic, 8-byte big-endian seq from 0, msgpack
// EventBatch [ts, events, data_parallel_rank 0]], one batch per engine step that produced
// events (events within BatchWindow, default 2ms, share a batch). The PUB binds for endpoints
// with "*" or "::" (and ipc://, inproc://) and connects otherwise, like vLLM. Hashes are the
// last 8 digest bytes as a msgpack uint (HashInt, default) or the 32-byte digest as bin
// (HashBytes). The encoder writes msgspec's bytes exactly (tests hold the test vectors TV2-TV7
// of docs/internals/test-vectors.md): smallest int forms, float64 ts, map headers sized for the written
// keys. Eras (--kv-era), newest first, with positional BlockStored/BlockRemoved lengths:
//
//	map          tagged maps (#42892, v0.26): BlockStored 11 keys, BlockRemoved 4
//	map-minimal  tagged maps without extra_keys/group_idx/kv_cache_spec_kind (8 / 3 keys)
//	positional   last positional era, #40984 (12 / 4)
//	group-idx    #37688 (10 / 4)
//	extra-keys   #33304 (9 / 3)
//	lora-name    #27577 (8 / 3)
//	medium       #19737 (7 / 3)
//	dp-rank      #18925, batch gains data_parallel_rank (6 / 2)
//	v0.8         #16750, batch [ts, events] (6 / 2)
//
// The optional Replay ROUTER answers vLLM's replay protocol: a request [identity, "", start seq]
// gets every buffered batch (ReplayBuffer, default 10000) with seq >= start, then the end
// marker; ReplayNew sends [topic, seq, payload] and ["", ff*8, ""] (vLLM >= 0.26, #45177),
// ReplayOld [seq, payload] and [ff*8, ""]. Use a DEALER client. Without cgo the package builds
// and serves HTTP, and New refuses a KVEvents endpoint with a clear error.
//
// # Faults
//
// Faults (Config.Faults, Engine.SetFaults at runtime): ErrorRate (deterministic share of HTTP
// 500s), AddedLatency (before queueing), HangBeforeHeaders (take a slot, never answer, until the
// client leaves or Stop), AbortAfterChunks (end a stream after N events without [DONE] and close
// the connection), DropEveryNthBatch (batch seq N-1, 2N-1, … is not sent but keeps its seq and
// stays replayable: a gap), GarbageEveryNBatches (after every Nth batch, [topic, de ad be,
// non-msgpack bytes]: no seq taken). Engine.Restart empties the cache, the pending events and
// the replay buffer and starts the sequence again at 0 with an AllBlocksCleared batch.
//
// # Flags
//
// `rolter sim` (Main, ParseFlags; -x and --x both work): --host, --port (8000; 0 = free),
// --model, --engine-label, --kv-events, --replay, --topic, --kv-era, --hash-mode int|bytes,
// --replay-layout new|old, --replay-buffer, --block-size, --num-blocks, --max-num-seqs,
// --max-model-len, --max-tokens, --prefill-us-per-token, --decode-us-per-token, the
// disaggregated role --role prefill|decode|both, --engine-id, --side-channel-port (5600),
// --side-channel-host, --kv-lease-seconds (480), --transfer-us-per-block,
// --kv-load-failure-policy fail|recompute, SGLang's --bootstrap-timeout-seconds (300) and
// --waiting-timeout-seconds (300), the LoRA flags --enable-lora, --max-loras (1),
// --max-cpu-loras, --lora-modules, --lora-load-ms (100), --allow-runtime-lora, and the faults
// --error-rate, --added-latency-ms, --hang, --abort-after-chunks, --drop-every-nth-batch,
// --garbage-every-n-batches.
package sim
