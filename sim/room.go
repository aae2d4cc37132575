package sim

import (
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// The prefill side of SGLang's protocol. A request with bootstrap_room on a prefilling engine
// runs as any request with max_tokens 1 (its prefix cache applies), then its blocks stay held
// under the room, and its answer waits until a decode engine has read them, as SGLang's prefill
// server answers only once its inflight queue sees the transfer succeed
// (disaggregation/prefill.py process_disagg_prefill_inflight_queue: KVPoll.Success, then
// FINISH_LENGTH and stream_output). When no decode reads them within BootstrapTimeout
// (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT) they are freed and the prefill answers 500, as
// SGLang's failed bootstrap does (prepare_abort with INTERNAL_SERVER_ERROR).
//
// The side channel doubles as the bootstrap server (its port is the bootstrap port):
//
//	POST /room {"room": N, "start": k, "wait_ms": w}
//	    200 {"block_hashes": [...], "cached_tokens": c}  the room's blocks from k on; frees them
//	    404 {"error": "...", "retry": true}               not held here (yet) after waiting w ms
//	    410 {"error": "..."}                              the room failed (timed out, aborted)
//	POST /room/abort {"room": N}                          the decode's request was aborted
//
// SGLang's own handshake is different (the decode fetches the prefill's rank table from the
// bootstrap server, then sends its destination pages over ZMQ, and the prefill waits for them
// before it prefills); the sim prefills at once and lets the decode read, which keeps what the
// two clients see: either request may come first, the decode's answer follows the transfer, and
// either side leaving fails the other.

// room is the meeting point of one prefill request and one decode request.
type room struct {
	key    string
	hold   *kvHold // the prompt's blocks, until the decode reads them; nil for a tombstone
	cached int     // prompt tokens the prefill found in its cache, reported by the decode
	state  roomState
	why    string        // what failed, for roomFailed
	done   chan struct{} // closed when the room is served or failed
	timer  *time.Timer   // BootstrapTimeout: the lease of the blocks, or of a tombstone
}

type roomState uint8

const (
	roomHeld    roomState = iota // the prefill holds the blocks
	roomClaimed                  // a decode is reading them
	roomServed
	roomFailed
)

// maxRoomWait bounds how long one POST /room waits for its room to be held.
const maxRoomWait = time.Second

// holdRoom keeps the blocks of r, a prefill request of SGLang's protocol that completed, under its
// room and sets r.room. Called with e.mu held and r running.
func (e *Engine) holdRoom(r *request) {
	key := string(r.boot.room)
	if rm := e.rooms[key]; rm != nil {
		// A tombstone (the decode gave up first) or a room in use: nothing waits for these blocks.
		e.cache.release(r.held, r.private)
		r.held, r.private = r.held[:0], 0
		if rm.state != roomFailed {
			rm = &room{key: key, state: roomFailed, why: "bootstrap_room " + key + " is already in use here", done: make(chan struct{})}
			close(rm.done)
		} else {
			e.endRoom(rm, roomFailed, rm.why)
		}
		r.room = rm
		return
	}
	h := &kvHold{key: "room " + key, held: append([]*block(nil), r.held...), private: r.private}
	e.heldBlocks += len(h.held) + h.private
	rm := &room{key: key, hold: h, cached: r.cached, state: roomHeld, done: make(chan struct{})}
	rm.timer = time.AfterFunc(e.cfg.BootstrapTimeout, func() { e.expireRoom(rm) })
	h.timer = rm.timer
	e.rooms[key] = rm
	r.held, r.private = r.held[:0], 0
	r.room = rm
	close(e.roomSignal)
	e.roomSignal = make(chan struct{})
}

// endRoom frees rm's blocks, records how it ended and wakes its prefill request. Called with
// e.mu held.
func (e *Engine) endRoom(rm *room, st roomState, why string) {
	if rm.hold != nil {
		e.unhold(rm.hold)
		rm.hold = nil
	}
	if rm.timer != nil {
		rm.timer.Stop()
	}
	if e.rooms[rm.key] == rm {
		delete(e.rooms, rm.key)
	}
	if isClosed(rm.done) {
		return // a tombstone, or a room that ended already
	}
	rm.state, rm.why = st, why
	close(rm.done)
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// expireRoom ends a room no decode read within BootstrapTimeout, or drops a tombstone.
func (e *Engine) expireRoom(rm *room) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case rm.state == roomHeld:
		e.endRoom(rm, roomFailed, "Request "+rm.key+" timed out after "+
			strconv.FormatFloat(e.cfg.BootstrapTimeout.Seconds(), 'f', 1, 64)+"s in KVPoll.Bootstrapping")
		e.roomsExpired.Add(1)
	case rm.state == roomFailed && e.rooms[rm.key] == rm:
		delete(e.rooms, rm.key)
	}
}

// awaitRoom waits until r's room is read (nil, true) or fails (the error to answer, true); false
// when r's client went away (the room is failed and its blocks freed, as SGLang aborts the
// request) or the engine stops.
func (e *Engine) awaitRoom(r *request) (*apiError, bool) {
	rm := r.room
	for {
		r.timer.Reset(alivePoll)
		select {
		case <-rm.done:
			r.timer.Stop()
			e.mu.Lock()
			st, why := rm.state, rm.why
			e.mu.Unlock()
			if st == roomServed {
				return nil, true
			}
			return roomError("Prefill transfer failed for request rid=" + strconv.Quote(string(r.id)) + " bootstrap_room=" + rm.key +
				" with exception KVTransferError(bootstrap_room=" + rm.key + "): " + why), true
		case <-e.stopCh:
			r.timer.Stop()
			return nil, false
		case <-r.timer.C:
			if r.alive() {
				continue
			}
			e.mu.Lock()
			if rm.state == roomHeld {
				e.endRoom(rm, roomFailed, "the prefill request was aborted")
				e.roomsAborted.Add(1)
			}
			e.mu.Unlock()
			return nil, false
		}
	}
}

// releaseRooms fails every room and frees its blocks, when the engine stops.
func (e *Engine) releaseRooms() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, rm := range e.rooms {
		e.endRoom(rm, roomFailed, "the engine is shutting down")
	}
}

// roomKey reads the "room" member of a side channel call as its integer literal.
func roomKey(v *fastjson.Value) (string, bool) {
	rv := v.Get("room")
	if rv == nil || rv.Type() != fastjson.TypeNumber {
		return "", false
	}
	raw := rv.MarshalTo(nil)
	if !integerLiteral(raw) {
		return "", false
	}
	return string(raw), true
}

// serveRoom answers a decode engine's read of a room: it waits up to wait_ms for the room to be
// held, claims it, takes TransferPerBlock per block sent and frees it.
func (e *Engine) serveRoom(ctx *fasthttp.RequestCtx) {
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, err := p.ParseBytes(ctx.PostBody())
	if err != nil || v.Type() != fastjson.TypeObject {
		e.pullError(ctx, fasthttp.StatusBadRequest, "cannot parse room read: want a JSON object {room, start, wait_ms}")
		return
	}
	key, ok := roomKey(v)
	start, wait := v.GetInt("start"), time.Duration(v.GetInt("wait_ms"))*time.Millisecond
	if !ok || start < 0 || wait < 0 {
		e.pullError(ctx, fasthttp.StatusBadRequest, "room must be an integer, start and wait_ms non-negative integers")
		return
	}
	deadline := time.Now().Add(min(wait, maxRoomWait))
	e.mu.Lock()
	rm := e.rooms[key]
	for rm == nil {
		sig := e.roomSignal
		e.mu.Unlock()
		left := time.Until(deadline)
		if left <= 0 {
			ctx.SetStatusCode(fasthttp.StatusNotFound)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":"room ` + key + ` is not held here (yet)","retry":true}`)
			return
		}
		t := time.NewTimer(left)
		select {
		case <-sig:
		case <-t.C:
		case <-e.stopCh:
			t.Stop()
			e.pullError(ctx, fasthttp.StatusServiceUnavailable, "the engine is shutting down")
			return
		}
		t.Stop()
		e.mu.Lock()
		rm = e.rooms[key]
	}
	if rm.state != roomHeld {
		why := rm.why
		if rm.state != roomFailed {
			why = "room " + key + " is being read by another decode"
		}
		e.mu.Unlock()
		e.pullError(ctx, fasthttp.StatusGone, why)
		return
	}
	rm.state = roomClaimed
	rm.timer.Stop()
	held := rm.hold.held[min(start, len(rm.hold.held)):]
	hashes := make([]blockHash, len(held))
	for i, b := range held {
		hashes[i] = b.hash
	}
	cached := rm.cached
	e.mu.Unlock()

	if d := time.Duration(len(hashes)) * e.cfg.TransferPerBlock; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-e.stopCh:
			t.Stop()
		}
	}
	e.mu.Lock()
	e.endRoom(rm, roomServed, "")
	e.mu.Unlock()
	e.roomsServed.Add(1)
	e.blocksSent.Add(uint64(len(hashes)))

	b := appendHashList(nil, hashes)
	b = append(b, `,"cached_tokens":`...)
	b = strconv.AppendInt(b, int64(cached), 10)
	ctx.SetContentType("application/json")
	ctx.SetBody(append(b, '}'))
}

// serveRoomAbort frees a room whose decode request was aborted, as SGLang's decode tells the
// prefill (the receiver's abort notification), so the prefill request fails at once instead of
// at its bootstrap timeout. A room not held yet gets a tombstone for BootstrapTimeout: the prefill
// request that comes later fails at once.
func (e *Engine) serveRoomAbort(ctx *fasthttp.RequestCtx) {
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, err := p.ParseBytes(ctx.PostBody())
	key, ok := "", false
	if err == nil && v.Type() == fastjson.TypeObject {
		key, ok = roomKey(v)
	}
	if !ok {
		e.pullError(ctx, fasthttp.StatusBadRequest, "cannot parse room abort: want {\"room\": an integer}")
		return
	}
	const why = "the decode request was aborted"
	e.mu.Lock()
	switch rm := e.rooms[key]; {
	case rm == nil:
		rm = &room{key: key, state: roomFailed, why: why, done: make(chan struct{})}
		close(rm.done)
		rm.timer = time.AfterFunc(e.cfg.BootstrapTimeout, func() { e.expireRoom(rm) })
		e.rooms[key] = rm
		e.roomsAborted.Add(1)
	case rm.state == roomHeld:
		e.endRoom(rm, roomFailed, why)
		e.roomsAborted.Add(1)
	}
	e.mu.Unlock()
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{}`)
}
