package disagg

// prefillParams is the kv_transfer_params of a prefill request, exactly as vLLM's reference proxy for the
// NixlConnector sends it (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py,
// send_request_to_service; llm-d's routing sidecar sends the same six keys, connector_nixlv2.go). It asks
// the prefill engine to keep the prompt's KV blocks for a remote decode and to answer where they are.
const prefillParams = `"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,` +
	`"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`

// AppendPrefill appends to dst the suffix that turns the client's body o into the prefill request of
// vLLM's disaggregation protocol, and returns the extended buffer. Insert it at o.End.
//
// The members are those of vLLM's proxy (send_request_to_service):
//   - "kv_transfer_params": the do_remote_decode request above;
//   - "stream": false and "max_tokens": 1, always: the prefill answers one token as one JSON body;
//   - "max_completion_tokens": 1, when the body has that key (the proxy sets it only then);
//   - "stream_options": null, when the body has it: the proxy deletes it, since vLLM refuses
//     stream_options without stream ("Stream options can only be defined when `stream=True`"); vLLM's
//     check is on the value's truth, and null is also the field's default;
//   - "min_tokens": 0 and "min_completion_tokens": 0, when the body has them: the proxy removes them ("not
//     supported for P": vLLM refuses min_tokens above max_tokens); 0 is vLLM's default (min_tokens: int =
//     0), where null would fail validation.
//
// A removed key is thus sent as its default value rather than left out: the engine can only append.
// Nothing is allocated when dst has room (about 250 bytes). Safe for concurrent use.
func AppendPrefill(dst []byte, o Object) []byte {
	dst = o.sep(dst)
	dst = append(dst, prefillParams...)
	dst = append(dst, `,"stream":false,"max_tokens":1`...)
	if o.has&uint8(keyMaxCompletionTokens) != 0 {
		dst = append(dst, `,"max_completion_tokens":1`...)
	}
	if o.has&uint8(keyStreamOptions) != 0 {
		dst = append(dst, `,"stream_options":null`...)
	}
	if o.has&uint8(keyMinTokens) != 0 {
		dst = append(dst, `,"min_tokens":0`...)
	}
	if o.has&uint8(keyMinCompletionTokens) != 0 {
		dst = append(dst, `,"min_completion_tokens":0`...)
	}
	return dst
}
