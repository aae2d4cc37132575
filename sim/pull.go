package sim

import (
	"bufio"
	"encoding/hex"
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// The decode side of a disaggregated fleet. A request with do_remote_prefill reads the prompt
// blocks it does not hold from the prefill engine named by remote_host:remote_port before it
// is scheduled (vLLM parks it in WAITING_FOR_REMOTE_KVS meanwhile), then runs as any request
// whose prompt is cached up to those blocks: it computes the rest (at least the last token),
// caches the read blocks (BlockStored) and decodes. As vLLM's
// _update_waiting_for_remote_kv, a prompt read in full still recomputes its last token, so
// cached_tokens is prompt_tokens - 1 then.
//
// When the read fails (the prefill engine is gone, the blocks expired or were read already,
// the engine id is wrong, the answer is garbage or names other blocks), KVLoadFailure decides:
// LoadFail (vLLM's default) answers HTTP 500, LoadRecompute computes the prompt locally.

// pullTimeout bounds one pull beyond its transfer time.
const pullTimeout = 10 * time.Second

var errPullAnswer = errors.New("cannot read pull answer: want {\"block_hashes\": [one 64-hex-digit digest per block]}")

// pullRemote reads r's missing prompt blocks from the prefill engine its kv_transfer_params
// name. It returns nil when r can run (blocks read, nothing to read, or recompute after a
// failure), and the error to answer otherwise.
func (e *Engine) pullRemote(r *request) *apiError {
	k := &r.kv
	if !e.cfg.Role.decodes() || !k.doRemotePrefill {
		return nil
	}
	e.remoteDecodes.Add(1)
	if len(k.blockIDs) == 0 || !k.complete() {
		// vLLM: no blocks (a prompt shorter than a block) means nothing to read, and params
		// missing a field are "invalid KVTransferParams ... will not utilize KVTransfer".
		return nil
	}
	full := len(r.hashes)
	n := min(len(k.blockIDs), full)
	e.mu.Lock()
	start := e.cache.match(r.hashes, max((len(r.tokens)-1)/e.cfg.BlockSize, 0))
	e.mu.Unlock()
	start = min(start, n)
	// As vLLM's NIXL worker, read the tail of the remote blocks that lines up with the local
	// blocks still to fill; an empty read still frees the blocks on the prefill side.
	ids := k.blockIDs[len(k.blockIDs)-(n-start):]
	began := time.Now()
	err := e.pull(r, ids, start)
	r.out = r.out[:0] // the pull's body
	if err == nil {
		if len(ids) > 0 {
			e.observeTransfer(time.Since(began))
		}
		r.pulledStart, r.pulledEnd = start, n
		e.blocksReceived.Add(uint64(n - start))
		return nil
	}
	if len(ids) == 0 {
		// Nothing was to be read, only the prefill engine told to free: vLLM counts a failed
		// notification and the request runs on its local hit.
		e.failedNotifs.Add(1)
		return nil
	}
	e.pullsFailed.Add(1)
	if e.cfg.KVLoadFailure == LoadRecompute {
		return nil
	}
	return &apiError{status: 500, typ: "InternalServerError", msg: "cannot load KV blocks from remote prefill engine " +
		strconv.Quote(string(k.engineID)) + " (kv_load_failure_policy fail): " + err.Error()}
}

// pull asks the side channel for ids and checks the answer against r's hashes from start on.
func (e *Engine) pull(r *request, ids []uint32, start int) error {
	k := &r.kv
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	addr := net.JoinHostPort(string(k.host), strconv.Itoa(k.port))
	req.SetRequestURI("http://" + addr + "/pull")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetConnectionClose()
	req.Header.SetContentType("application/json")
	b := append(r.out[:0], `{"engine_id":`...)
	b = appendJSONString(b, string(k.engineID))
	b = append(b, `,"request_id":`...)
	b = appendJSONString(b, string(k.requestID))
	b = append(b, `,"block_ids":[`...)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(id), 10)
	}
	r.out = append(b, "]}"...)
	req.SetBodyRaw(r.out)
	timeout := pullTimeout + time.Duration(len(ids))*e.cfg.TransferPerBlock
	if err := roundTrip(addr, req, resp, timeout); err != nil {
		return err
	}
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, err := p.ParseBytes(resp.Body())
	if resp.StatusCode() != fasthttp.StatusOK {
		msg := "prefill engine answered HTTP " + strconv.Itoa(resp.StatusCode())
		if err == nil {
			if m := v.GetStringBytes("error"); len(m) > 0 {
				msg += ": " + string(m)
			}
		}
		return errors.New(msg)
	}
	if err != nil {
		return errPullAnswer
	}
	hashes := v.GetArray("block_hashes")
	if len(hashes) != len(ids) {
		return errPullAnswer
	}
	for i, hv := range hashes {
		s, err := hv.StringBytes()
		var h blockHash
		if err != nil || len(s) != 2*len(h) {
			return errPullAnswer
		}
		if _, err := hex.Decode(h[:], s); err != nil {
			return errPullAnswer
		}
		if h != r.hashes[start+i] {
			return errors.New("block " + strconv.FormatUint(uint64(ids[i]), 10) + " holds other tokens than this prompt's block " + strconv.Itoa(start+i))
		}
	}
	return nil
}

// roundTrip sends req on a connection of its own and reads resp. One connection per pull keeps
// no pool, so no cleaner goroutines outlive the engine (fasthttp's Client keeps both).
func roundTrip(addr string, req *fasthttp.Request, resp *fasthttp.Response, timeout time.Duration) error {
	conn, err := net.DialTimeout("tcp", addr, min(timeout, pullTimeout))
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	w := bufio.NewWriter(conn)
	if err := req.Write(w); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	resp.Header.SetNoDefaultContentType(true)
	return resp.ReadLimitBody(bufio.NewReader(conn), maxPullBody<<4)
}
