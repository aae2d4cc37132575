// Package disagg holds the wire protocol of prefill/decode-disaggregated fleets: how the gateway turns one
// client request into a prefill request and a decode request, and what it takes from the prefill answer.
// The engine writes upstream bodies itself (the client's JSON body, model substituted) and can only append
// bytes; this package supplies the bytes it appends, with pure, allocation-free functions:
//
//	o, err := disagg.Scan(body)                 // one JSON object; o.End is its closing brace
//	p := append(buf[:0], body[:o.End]...)
//	p = disagg.AppendPrefill(p, o)              // vLLM: the prefill request
//	p = append(p, body[o.End:]...)
//	params, err := disagg.ParsePrefillAnswer(answer)
//	d = disagg.AppendDecode(d, o, params)       // vLLM: the decode request, same splice
//	b = disagg.AppendBootstrap(b, o, host, port, disagg.NewRoom()) // SGLang: both requests
//
// The facts below were read from the sources named with them (vLLM, llm-d, SGLang, FastAPI, Starlette),
// and are restated here in our own words.
//
// # vLLM (NixlConnector): two requests in sequence
//
// vLLM's reference proxy is tests/v1/kv_connector/nixl_integration/toy_proxy_server.py (the NixlConnector
// usage guide, docs/features/nixl_connector_usage.md, points to it). Per client request it:
//
//  1. Sends the prefill engine a copy of the client's JSON body (send_request_to_service) with
//     "kv_transfer_params" set to {"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id":
//     null, "remote_block_ids": null, "remote_host": null, "remote_port": null}, "stream": false,
//     "max_tokens": 1, "max_completion_tokens": 1 only if the body had that key, "stream_options" deleted if
//     present, and "min_tokens" and "min_completion_tokens" removed ("not supported for P"). It sends an
//     X-Request-Id header, the same for both requests, and reads the whole answer.
//  2. Takes the answer's "kv_transfer_params" and, when it is present and not empty, copies it into the
//     client's original body (stream, stream_options, max_tokens, min_tokens as the client sent them).
//     Otherwise it sends the client's body unchanged.
//  3. Streams the decode engine's answer to the client as it comes.
//
// llm-d's P/D sidecar does the same (llm-d-inference-scheduler pkg/sidecar/proxy/connector_nixlv2.go, and
// before it llm-d-routing-sidecar internal/proxy/connector_nixlv2.go): the same six kv_transfer_params keys,
// stream false, stream_options deleted, max_tokens and max_completion_tokens set to 1 (for the Responses
// API, max_output_tokens), the same X-Request-Id on both requests; for the decode request it restores the
// client's stream, stream_options and token limits and copies the prefill answer's kv_transfer_params
// (null when absent). It also takes usage.prompt_tokens_details.cached_tokens from the prefill answer and
// writes it over the decode answer's (cached_tokens_usage_rewriter.go): the decode engine counts the
// transferred blocks as cached, so usage accounting should use the prefill's figure. A prefill answer of
// 4xx (400 to 451) goes back to the client as it is; any other failure falls back to sending the client's
// original body to the decode engine (shouldFallbackToDecode).
//
// What the prefill engine answers: the NixlConnector's request_finished (vllm/distributed/kv_transfer/
// kv_connector/v1/nixl_connector.py, NixlConnectorScheduler) returns kv_transfer_params only for a request
// that asked do_remote_decode and finished FINISHED_LENGTH_CAPPED, that is, stopped at max_tokens 1: then it
// keeps the prompt's blocks and answers {"do_remote_prefill": true, "do_remote_decode": false,
// "remote_block_ids": [...], "remote_engine_id": ..., "remote_host": ..., "remote_port": ..., "tp_size":
// ...}, newer versions adding "remote_request_id" (the prefill's own request id, which the decode engine
// quotes when it tells the prefill engine it has read the blocks). A request that stopped on its first
// token (EOS, a stop string) or was aborted keeps nothing and answers no params: the chat endpoint drops
// null fields (model_dump(exclude_none=True), chat_completion/api_router.py), the completions endpoint
// writes "kv_transfer_params": null. We copy the params object as it is, whatever keys a version adds.
// Both routers send one X-Request-Id to both engines: vLLM builds its request id from that header, and
// versions whose params lack remote_request_id rely on the two ids matching; the engine should do the same.
//
// These suffixes cover POST /v1/chat/completions and /v1/completions, the two endpoints vLLM's proxy
// serves. The Responses API limits tokens with max_output_tokens (llm-d sets that one instead), so a
// /v1/responses request must not be split with AppendPrefill as it is.
//
// # Duplicate keys: why a suffix works
//
// vLLM's endpoints take the body as a pydantic model parameter (create_chat_completion(request:
// ChatCompletionRequest, raw_request: Request), chat_completion/api_router.py; create_completion likewise).
// FastAPI reads such a body with Starlette's request.json() (fastapi/routing.py, get_request_handler), which
// is json.loads(body) (starlette/requests.py, Request.json), and validates the resulting dict. Python's
// json.loads builds a dict, so of a repeated key the last value stays. pydantic's own model_validate_json
// keeps the last one too (checked with pydantic 2.13). vLLM's before-validators see that same dict
// (validate_stream_options tests data.get("stream_options") for truth). SGLang's OpenAI endpoints are
// FastAPI handlers of the same shape (http_server.py openai_v1_chat_completions(request:
// ChatCompletionRequest, raw_request)). So members appended after the client's override them, and a
// suffix before the closing brace is enough; the package tests decode the spliced bodies with Python's
// json.loads when python3 is installed.
//
// A removed key cannot be removed by appending; it is sent as the field's default instead, which vLLM's
// pydantic models treat as absent: "stream_options": null (StreamOptions | None = None), "min_tokens": 0
// (int = 0; null would fail validation). vLLM refuses min_tokens above max_tokens (SamplingParams
// _verify_args) and stream_options without stream, which is why the proxy drops them for the prefill.
// Keys a model does not define are ignored with a log line (OpenAIBaseModel's extra-fields check), so a
// key is only appended when the body had it, as the proxy does.
//
// Client-supplied kv_transfer_params must never reach an engine: a client could point a decode engine at
// a host of its choosing. AppendPrefill and AppendDecode always write the gateway's own
// "kv_transfer_params" after the client's members, so they win; routes that are not disaggregated should
// not forward the key at all. (A change proposed upstream, vllm/entrypoints/openai/
// kv_transfer_params_sanitizer.py, strips remote_host and remote_port from the params of every request at
// the API boundary for the same reason; were it to land as written, a decode engine could no longer learn
// the prefill's side channel from the request body, so the pairing of this package with vLLM versions
// should be checked against a real fleet.)
//
// # Failure semantics the engine must honour (vLLM)
//
//   - Prefill fails (connect error, non-2xx, timeout, invalid answer) before any byte reached the client:
//     pick another prefill target. A 4xx from the prefill is the client's fault and goes back as it is
//     (llm-d does so); nothing was kept on the prefill side. A valid answer without params
//     (ErrNoKVTransferParams) is not a failure: send the decode engine the plain request
//     (AppendDecode(dst, o, nil)), which prefills itself.
//   - Decode fails before its first byte: pick another decode target with the same params while the
//     prefill engine still holds the blocks; once they may be gone, run a fresh prefill first. The prefill
//     engine frees unread blocks after a lease: a fixed VLLM_NIXL_ABORT_REQUEST_TIMEOUT (default 480 s,
//     vllm/envs.py; request_finished records now + timeout) in older versions, and since the lease renewal
//     (docs/design/nixl_kv_cache_lease.md) an initial kv_lease_duration of 30 s (kv_connector_extra_config)
//     that a decode engine holding the request extends by heartbeats. A decode engine that receives the
//     params starts heartbeating at once, so the engine cannot tell from outside how long blocks stay: a
//     retry elsewhere after a decode failure should prefill afresh unless it happens well within the
//     initial lease. A decode request aborted before it was scheduled tells the prefill engine to free the
//     blocks (request_finished with do_remote_prefill still set).
//   - When the decode engine cannot read the blocks, vLLM applies kv_load_failure_policy
//     (--kv-transfer-config; vllm/config/kv_transfer.py: "fail" by default in current versions, or
//     "recompute" to prefill locally on the decode engine). "fail" ends the request with finish_reason
//     "error", which the OpenAI server turns into GenerationError("Internal server error"), status 500:
//     an error body when not streaming, and when streaming a data: {"error": ...} event inside a 200
//     stream (for chat after the role chunk), then [DONE]. So "before the first byte" means before the
//     first byte the gateway forwards to the client: the engine may hold back the decode's first event,
//     and on an error event there, retry with a fresh prefill instead of forwarding it.
//   - After the first byte reached the client: no retry; end the stream with the SSE error event.
//   - The client leaves: cancel both sides by closing their connections. vLLM aborts a request whose
//     client disconnected (with_cancellation on the endpoints); an aborted prefill keeps no blocks, an
//     aborted decode frees the prefill's blocks as above, and blocks nobody reads are freed when the lease
//     or timeout runs out.
//
// # SGLang: two requests at once
//
// SGLang's mini load balancer (python/sglang/srt/disaggregation/mini_lb.py) and sgl-model-gateway's PD
// router (sgl-model-gateway/src/routers/http/pd_types.rs, pd_router) send the same body to the prefill and
// the decode engine concurrently, adding "bootstrap_host" (the prefill engine's host from its URL,
// IPv6 in brackets), "bootstrap_port" (the prefill's configured bootstrap port, or null) and
// "bootstrap_room" (random.randint(0, 2**63 - 1) per request; the gateway masks a random u64 with
// i64::MAX). Nothing else changes: the prefill request keeps the client's stream and max_tokens (the
// prefill engine stops after prefilling by itself); the client gets the decode engine's answer, the
// prefill answer is read and dropped (mini_lb merges input_token_logprobs from it when the client asked
// return_logprob). SGLang's request models type the fields Optional[Union[List[str], str]],
// Optional[Union[List[Optional[int]], int]] and Optional[Union[List[int], int]] (entrypoints/openai/
// protocol.py, managers/io_struct.py): lists are for batched /generate requests only. llm-d's SGLang
// connector (connector_sglang.go) does the same with port 8998 by default (SGLANG_BOOTSTRAP_PORT).
//
// Three more facts (python/sglang/srt/disaggregation/prefill.py, decode.py, managers/scheduler.py): the
// prefill server forces max_new_tokens to 1 and answers only after the transfer to its decode peer
// succeeded, so a router must send the decode request before it waits for the prefill's answer; the decode
// server reports the prefill's cached_tokens, shipped with the KV, not the transferred prefix; and a null
// bootstrap_port means the prefill engine's own --disaggregation-bootstrap-port.
//
// Failure semantics (SGLang): the prefill and the decode fail together. sgl-model-gateway drops the decode
// request when the prefill fails (the decode engine would otherwise wait for the KV up to its
// disaggregation timeout, 300 s) and answers the prefill's error; a decode that fails first aborts the
// prefill; it runs both requests in the client's handler, so a client that leaves cancels both. A retry is
// a new pair with a new room. llm-d sends the prefill detached (context.WithoutCancel), so that a decode
// finishing first does not abort it.
package disagg
