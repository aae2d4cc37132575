package sim

import (
	"math"
	"strconv"

	"github.com/valyala/fastjson"
)

// kvParams is a request's kv_transfer_params, the dict vLLM's NixlConnector reads
// (vllm/distributed/kv_transfer/kv_connector/v1/nixl: get_num_new_matched_tokens,
// update_state_after_alloc, request_finished). The proxy sends a prefill engine
// {"do_remote_decode": true, "do_remote_prefill": false, the remote_* fields null}, and the
// decode engine what the prefill engine answered. Fields vLLM adds that the sim has no use for
// (dcp_size, pp_size, transfer_mode, ...) are accepted and ignored.
type kvParams struct {
	set             bool // the body had a kv_transfer_params object
	doRemoteDecode  bool
	doRemotePrefill bool
	engineID        []byte
	requestID       []byte
	host            []byte
	port            int
	blockIDs        []uint32
}

func (k *kvParams) reset() {
	k.set, k.doRemoteDecode, k.doRemotePrefill = false, false, false
	k.engineID, k.requestID, k.host = k.engineID[:0], k.requestID[:0], k.host[:0]
	k.port = 0
	k.blockIDs = k.blockIDs[:0]
}

// complete reports whether the params name everything a pull needs. vLLM serves a request
// whose params lack one of them without a transfer ("Got invalid KVTransferParams").
func (k *kvParams) complete() bool {
	return len(k.engineID) > 0 && len(k.requestID) > 0 && len(k.host) > 0 && k.port > 0
}

// parseKVParams reads v's kv_transfer_params. A field of the wrong type is a 400: vLLM takes
// the dict as it is and would fail deep in the connector; the sim says which field is wrong.
func (r *request) parseKVParams(v *fastjson.Value) *apiError {
	k := &r.kv
	pv := v.Get("kv_transfer_params")
	if pv == nil || pv.Type() == fastjson.TypeNull {
		return nil
	}
	if pv.Type() != fastjson.TypeObject {
		return badRequest("kv_transfer_params must be an object or null")
	}
	k.set = true
	var e *apiError
	k.doRemoteDecode, e = kvBool(pv, "do_remote_decode")
	if e != nil {
		return e
	}
	if k.doRemotePrefill, e = kvBool(pv, "do_remote_prefill"); e != nil {
		return e
	}
	if k.engineID, e = kvString(k.engineID, pv, "remote_engine_id"); e != nil {
		return e
	}
	if k.requestID, e = kvString(k.requestID, pv, "remote_request_id"); e != nil {
		return e
	}
	if k.host, e = kvString(k.host, pv, "remote_host"); e != nil {
		return e
	}
	if f := pv.Get("remote_port"); f != nil && f.Type() != fastjson.TypeNull {
		n, err := f.Int()
		if err != nil || n < 1 || n > 65535 {
			return badRequest("kv_transfer_params.remote_port must be a port number 1..65535 or null")
		}
		k.port = n
	}
	return r.parseBlockIDs(pv.Get("remote_block_ids"))
}

// parseBlockIDs reads remote_block_ids: a list of block numbers, or one such list per KV cache
// group as newer vLLM sends them (the sim has one group).
func (r *request) parseBlockIDs(f *fastjson.Value) *apiError {
	if f == nil || f.Type() == fastjson.TypeNull {
		return nil
	}
	const msg = "kv_transfer_params.remote_block_ids must be a list of non-negative integers (or one such list per KV cache group) or null"
	a, err := f.Array()
	if err != nil {
		return badRequest(msg)
	}
	if len(a) > 0 && a[0].Type() == fastjson.TypeArray {
		if len(a) > 1 {
			return badRequest("kv_transfer_params.remote_block_ids names more than one KV cache group; the sim has one")
		}
		if a, err = a[0].Array(); err != nil {
			return badRequest(msg)
		}
	}
	for _, x := range a {
		n, err := x.Uint()
		if err != nil || n > math.MaxUint32 {
			return badRequest(msg)
		}
		r.kv.blockIDs = append(r.kv.blockIDs, uint32(n))
	}
	return nil
}

func kvBool(o *fastjson.Value, key string) (bool, *apiError) {
	f := o.Get(key)
	if f == nil || f.Type() == fastjson.TypeNull {
		return false, nil
	}
	b, err := f.Bool()
	if err != nil {
		return false, badRequest("kv_transfer_params." + key + " must be a boolean or null")
	}
	return b, nil
}

func kvString(dst []byte, o *fastjson.Value, key string) ([]byte, *apiError) {
	f := o.Get(key)
	if f == nil || f.Type() == fastjson.TypeNull {
		return dst, nil
	}
	s, err := f.StringBytes()
	if err != nil || len(s) > 256 || !plainID(s) {
		return dst, badRequest("kv_transfer_params." + key + " must be a printable string of at most 256 bytes or null")
	}
	return append(dst, s...), nil
}

// appendOffer appends the kv_transfer_params a prefill engine answers a do_remote_decode
// request with, as the pull NixlConnector's request_finished returns them: the decode side is
// to do the remote prefill, here are the blocks, the engine and the side channel to read them
// from.
func (r *request) appendOffer(dst []byte) []byte {
	e := r.e
	dst = append(dst, `"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[`...)
	for i, id := range r.offerIDs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(id), 10)
	}
	dst = append(dst, `],"remote_engine_id":`...)
	dst = appendJSONString(dst, e.cfg.EngineID)
	dst = append(dst, `,"remote_request_id":`...)
	dst = appendJSONString(dst, r.offerKey)
	dst = append(dst, `,"remote_host":`...)
	dst = appendJSONString(dst, e.cfg.SideChannelHost)
	dst = append(dst, `,"remote_port":`...)
	dst = strconv.AppendInt(dst, int64(e.sideChannelPort()), 10)
	dst = append(dst, `,"tp_size":1,"remote_num_tokens":`...)
	dst = strconv.AppendInt(dst, int64(len(r.tokens)), 10)
	return append(dst, `}`...)
}
