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
// families) and vllm:cache_config_info, labelled engine (EngineLabel) and model_name, with
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
// --max-model-len, --max-tokens, --prefill-us-per-token, --decode-us-per-token, and the faults
// --error-rate, --added-latency-ms, --hang, --abort-after-chunks, --drop-every-nth-batch,
// --garbage-every-n-batches.
package sim
