package sim

import (
	"encoding/hex"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// The prefill side of a disaggregated fleet. A finished do_remote_decode request keeps its
// blocks (a kvHold) instead of freeing them, as vLLM's NixlConnector delays the free
// (request_finished returns delay_free_blocks); a decode engine reads them through the side
// channel, which frees them, or KVLease passes and they are freed unread
// (vllm:nixl_num_kv_expired_reqs).
//
// The side channel stands in for NIXL's handshake plus RDMA read plus the "done" notification:
// one HTTP call,
//
//	POST /pull {"engine_id": "...", "request_id": "...", "block_ids": [3, 4, 5]}
//	200 {"block_hashes": ["<64 hex digits>", ...]}   one per block id, in order
//	4xx {"error": "..."}                             nothing moved
//
// It takes TransferPerBlock per block named and releases the whole hold, whatever subset was
// read (a decode engine with a local prefix hit reads only the tail, and an empty list just
// frees the blocks, as vLLM's notification does). The hashes are the sim's stand-in for the KV
// data: the decode engine checks them against its own prompt.

// kvHold is the blocks of one finished do_remote_decode request, waiting for a pull.
type kvHold struct {
	key     string
	held    []*block // the full prompt blocks, pinned
	private int      // the request's other blocks (partial prompt block, output)
	timer   *time.Timer
}

// maxPullBody bounds a pull request: ids of a whole cache and a little more.
const maxPullBody = 1 << 20

// hold turns the blocks of r, a do_remote_decode request that completed, into a kvHold and
// sets r's offer. Called with e.mu held and r running.
func (e *Engine) hold(r *request) {
	r.offerIDs = r.offerIDs[:0]
	for _, b := range r.held {
		r.offerIDs = append(r.offerIDs, b.id)
	}
	r.offerKey = string(r.id) + "-" + strconv.FormatUint(e.idSeq.Add(1), 16)
	e.remotePrefills.Add(1)
	if len(r.held) == 0 {
		// vLLM: a prompt shorter than a block has nothing to transfer; free at once.
		e.cache.release(r.held, r.private)
		r.held, r.private = r.held[:0], 0
		return
	}
	h := &kvHold{key: r.offerKey, held: append([]*block(nil), r.held...), private: r.private}
	e.holds[h.key] = h
	e.heldBlocks += len(h.held) + h.private
	h.timer = time.AfterFunc(e.cfg.KVLease, func() { e.expire(h.key) })
	r.held = r.held[:0]
	r.private = 0
}

// expire frees a hold nobody pulled in time.
func (e *Engine) expire(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.holds[key]
	if h == nil {
		return
	}
	e.unhold(h)
	e.expiredReqs++
	e.expiredBlocks += uint64(len(h.held))
}

// unhold frees h's blocks and lets waiting requests in; h may already be out of the table (a
// pull claimed it). Called with e.mu held.
func (e *Engine) unhold(h *kvHold) {
	delete(e.holds, h.key)
	h.timer.Stop()
	e.heldBlocks -= len(h.held) + h.private
	e.cache.release(h.held, h.private)
	e.schedule()
}

// releaseHolds frees every hold, when the engine stops.
func (e *Engine) releaseHolds() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, h := range e.holds {
		e.unhold(h)
	}
}

// sideChannelPort returns the port decode engines pull from, 0 before Start or without one.
func (e *Engine) sideChannelPort() int {
	if e.sideLn == nil {
		return 0
	}
	return e.sideLn.Addr().(*net.TCPAddr).Port
}

// SideChannelAddr returns the host:port of the block pull side channel; empty before Start
// and for engines that do not prefill for others.
func (e *Engine) SideChannelAddr() string {
	if e.sideLn == nil {
		return ""
	}
	return e.sideLn.Addr().String()
}

// startSideChannel listens for pulls. Called by Start for prefilling roles.
func (e *Engine) startSideChannel() error {
	addr := net.JoinHostPort(e.cfg.Host, strconv.Itoa(e.cfg.SideChannelPort))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	e.sideLn = ln
	e.sideSrv = &fasthttp.Server{
		Handler:               e.serveSide,
		Name:                  "rolter-sim-side-channel",
		ReadTimeout:           10 * time.Second,
		IdleTimeout:           e.cfg.IdleTimeout,
		MaxRequestBodySize:    maxPullBody,
		CloseOnShutdown:       true,
		MaxIdleWorkerDuration: 100 * time.Millisecond,
		Logger:                quietLogger{},
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		_ = e.sideSrv.Serve(ln)
	}()
	return nil
}

// pullError answers a refused pull.
func (e *Engine) pullError(ctx *fasthttp.RequestCtx, status int, msg string) {
	e.pullsRefused.Add(1)
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	b := append([]byte(`{"error":`), appendJSONString(nil, msg)...)
	ctx.SetBody(append(b, '}'))
}

// serveSide routes the side channel: vLLM's pulls, and the reads and aborts of SGLang's rooms
// (room.go).
func (e *Engine) serveSide(ctx *fasthttp.RequestCtx) {
	if ctx.IsPost() {
		switch string(ctx.Path()) {
		case "/pull":
			e.servePull(ctx)
			return
		case "/room":
			e.serveRoom(ctx)
			return
		case "/room/abort":
			e.serveRoomAbort(ctx)
			return
		}
	}
	e.pullError(ctx, fasthttp.StatusNotFound, "the side channel serves POST /pull, /room and /room/abort")
}

// servePull answers one pull: the named blocks' hashes after the transfer time, and the hold freed.
func (e *Engine) servePull(ctx *fasthttp.RequestCtx) {
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, err := p.ParseBytes(ctx.PostBody())
	if err != nil || v.Type() != fastjson.TypeObject {
		e.pullError(ctx, fasthttp.StatusBadRequest, "cannot parse pull: want a JSON object {engine_id, request_id, block_ids}")
		return
	}
	engineID := v.GetStringBytes("engine_id")
	if string(engineID) != e.cfg.EngineID {
		e.pullError(ctx, fasthttp.StatusBadRequest, "unknown engine id "+strconv.Quote(string(engineID))+": this is "+strconv.Quote(e.cfg.EngineID))
		return
	}
	ids, ok := pullIDs(v.Get("block_ids"))
	if !ok {
		e.pullError(ctx, fasthttp.StatusBadRequest, "block_ids must be a list of non-negative integers")
		return
	}
	reqID := string(v.GetStringBytes("request_id"))
	e.mu.Lock()
	h := e.holds[reqID]
	if h == nil {
		e.mu.Unlock()
		e.pullError(ctx, fasthttp.StatusNotFound, "no blocks held for request "+strconv.Quote(reqID)+": never prefilled here, already pulled, or expired")
		return
	}
	hashes := make([]blockHash, 0, len(ids))
	for _, id := range ids {
		b := h.find(id)
		if b == nil {
			e.mu.Unlock()
			e.pullError(ctx, fasthttp.StatusBadRequest, "block "+strconv.FormatUint(uint64(id), 10)+" is not one of request "+strconv.Quote(reqID)+"'s blocks")
			return
		}
		hashes = append(hashes, b.hash)
	}
	// Claim the hold: a second pull, or the lease running out meanwhile, finds nothing.
	delete(e.holds, reqID)
	h.timer.Stop()
	e.mu.Unlock()

	if d := time.Duration(len(ids)) * e.cfg.TransferPerBlock; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-e.stopCh:
			t.Stop()
		}
	}

	e.mu.Lock()
	e.unhold(h)
	e.mu.Unlock()
	e.pullsServed.Add(1)
	e.blocksSent.Add(uint64(len(ids)))

	ctx.SetContentType("application/json")
	ctx.SetBody(append(appendHashList(nil, hashes), '}'))
}

// appendHashList appends `{"block_hashes":[...]` - the hex digests of the blocks a pull moves, which the
// reader checks against its own prompt - without the closing brace, for the caller's other members.
func appendHashList(b []byte, hashes []blockHash) []byte {
	b = append(b, `{"block_hashes":[`...)
	for i := range hashes {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = hex.AppendEncode(b, hashes[i][:])
		b = append(b, '"')
	}
	return append(b, ']')
}

func (h *kvHold) find(id uint32) *block {
	for _, b := range h.held {
		if b.id == id {
			return b
		}
	}
	return nil
}

func pullIDs(v *fastjson.Value) ([]uint32, bool) {
	if v == nil {
		return nil, false
	}
	a, err := v.Array()
	if err != nil {
		return nil, false
	}
	ids := make([]uint32, 0, len(a))
	for _, x := range a {
		n, err := x.Uint()
		if err != nil || n > 1<<32-1 {
			return nil, false
		}
		ids = append(ids, uint32(n))
	}
	return ids, true
}
