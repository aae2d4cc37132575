package disagg

// AppendDecode appends to dst the suffix that turns the client's body o into the decode request of vLLM's
// disaggregation protocol, and returns the extended buffer. Insert it at o.End.
//
// The decode request is the client's request (stream, stream_options, max_tokens as the client sent them)
// with the prefill answer's "kv_transfer_params" object copied in, as vLLM's proxy does
// (_handle_completions). kvParams is what ParsePrefillAnswer returned; AppendDecode copies it and keeps no
// reference. A nil kvParams appends "kv_transfer_params": null: a plain request that the decode engine
// prefills itself (ParsePrefillAnswer's ErrNoKVTransferParams), with any kv_transfer_params the client put
// in its own body overridden, so a client never steers a decode engine to pull blocks from a host of its
// choosing.
//
// Nothing is allocated when dst has room. Safe for concurrent use.
func AppendDecode(dst []byte, o Object, kvParams []byte) []byte {
	dst = o.sep(dst)
	dst = append(dst, `"kv_transfer_params":`...)
	if kvParams == nil {
		return append(dst, "null"...)
	}
	return append(dst, kvParams...)
}
