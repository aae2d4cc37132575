package sim

import (
	"encoding/hex"
	"errors"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// The decode side of SGLang's protocol. A request with bootstrap_room on a decode engine reads
// the room's blocks from the prefill engine at bootstrap_host:bootstrap_port (the prefill's side
// channel; a null port means the decode's own SideChannelPort, as SGLang's scheduler falls back
// to its --disaggregation-bootstrap-port) before it is scheduled, waiting for them as long as
// WaitingTimeout (SGLANG_DISAGGREGATION_WAITING_TIMEOUT, 300s) allows. The prefill request may
// come before or after. The blocks it holds already are not read again; the read ones count as
// cached, as in vLLM's path, but usage reports the prefill engine's cached_tokens
// (disaggregation/decode.py _commit_transfer_to_req). When the room never comes, the prefill
// engine is unreachable or the room failed, the request fails with HTTP 500, as SGLang's
// DecodeTransferQueue aborts it (prepare_abort with INTERNAL_SERVER_ERROR). When its client
// leaves while it waits, it tells the prefill engine (POST /room/abort), which frees the room.

// roomPoll is how long one read of a room waits on the prefill side before the decode looks at
// its own client again.
const roomPoll = 100 * time.Millisecond

// fetchRoom reads r's room. It returns (nil, true) when r can run, (error, true) when r fails,
// and false when r's client went away or the engine stops.
func (e *Engine) fetchRoom(r *request) (*apiError, bool) {
	b := &r.boot
	e.roomDecodes.Add(1)
	port := b.port
	if port == 0 {
		port = e.cfg.SideChannelPort
	}
	fail := func(why string) (*apiError, bool) {
		e.roomsFailed.Add(1)
		return roomError("Decode transfer failed for request rid=" + strconv.Quote(string(r.id)) + " bootstrap_room=" + string(b.room) +
			" with exception KVTransferError(bootstrap_room=" + string(b.room) + "): " + why), true
	}
	if len(b.host) == 0 || port == 0 {
		return fail("no bootstrap server to ask: bootstrap_host " + strconv.Quote(string(b.host)) + ", port " + strconv.Itoa(port))
	}
	// SGLang's routers write an IPv6 host in brackets (maybe_wrap_ipv6_address).
	host := strings.TrimSuffix(strings.TrimPrefix(string(b.host), "["), "]")
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	full := len(r.hashes)
	e.mu.Lock()
	start := min(e.cache.match(r.hashes, max((len(r.tokens)-1)/e.cfg.BlockSize, 0)), full)
	e.mu.Unlock()
	began := time.Now()
	deadline := began.Add(e.cfg.WaitingTimeout)
	for {
		if e.stopped() {
			return nil, false
		}
		if !r.alive() {
			e.abortRoom(addr, b.room)
			return nil, false
		}
		wait := min(time.Until(deadline), roomPoll)
		if wait <= 0 {
			return fail("Request " + string(b.room) + " timed out after " +
				strconv.FormatFloat(time.Since(began).Seconds(), 'f', 1, 64) + "s in KVPoll.WaitingForInput")
		}
		n, cached, retry, err := e.readRoom(r, addr, start, wait)
		r.out = r.out[:0]
		switch {
		case retry:
			continue
		case err != nil:
			return fail(err.Error())
		}
		r.pulledStart, r.pulledEnd = start, start+n
		r.reportCached = min(cached, len(r.tokens))
		e.blocksReceived.Add(uint64(n))
		return nil, true
	}
}

// readRoom asks the prefill engine at addr for r's room from block start on, waiting up to wait
// for it to be held. It returns the blocks read and the prefill's cached tokens; retry when the
// room is not held yet.
func (e *Engine) readRoom(r *request, addr string, start int, wait time.Duration) (n, cached int, retry bool, err error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + "/room")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetConnectionClose()
	req.Header.SetContentType("application/json")
	body := append(r.out[:0], `{"room":`...)
	body = append(body, r.boot.room...)
	body = append(body, `,"start":`...)
	body = strconv.AppendInt(body, int64(start), 10)
	body = append(body, `,"wait_ms":`...)
	body = strconv.AppendInt(body, wait.Milliseconds(), 10)
	r.out = append(body, '}')
	req.SetBodyRaw(r.out)
	timeout := wait + pullTimeout + time.Duration(len(r.hashes))*e.cfg.TransferPerBlock
	if err := roundTrip(addr, req, resp, timeout); err != nil {
		return 0, 0, false, errors.New("Failed to get kvcache from prefill instance " + addr + ", it might be dead: " + err.Error())
	}
	p := parserPool.Get()
	defer parserPool.Put(p)
	v, perr := p.ParseBytes(resp.Body())
	if resp.StatusCode() != fasthttp.StatusOK {
		if perr == nil && resp.StatusCode() == fasthttp.StatusNotFound && v.GetBool("retry") {
			return 0, 0, true, nil
		}
		msg := "prefill engine answered HTTP " + strconv.Itoa(resp.StatusCode())
		if perr == nil {
			if m := v.GetStringBytes("error"); len(m) > 0 {
				msg += ": " + string(m)
			}
		}
		return 0, 0, false, errors.New(msg)
	}
	if perr != nil {
		return 0, 0, false, errPullAnswer
	}
	hashes := v.GetArray("block_hashes")
	if len(hashes) > len(r.hashes)-start {
		return 0, 0, false, errors.New("the room holds " + strconv.Itoa(start+len(hashes)) + " blocks, this prompt " + strconv.Itoa(len(r.hashes)))
	}
	for i, hv := range hashes {
		s, err := hv.StringBytes()
		var h blockHash
		if err != nil || len(s) != 2*len(h) {
			return 0, 0, false, errPullAnswer
		}
		if _, err := hex.Decode(h[:], s); err != nil {
			return 0, 0, false, errPullAnswer
		}
		if h != r.hashes[start+i] {
			return 0, 0, false, errors.New("the room's block " + strconv.Itoa(start+i) + " holds other tokens than this prompt's: the prefill request had another body")
		}
	}
	return len(hashes), v.GetInt("cached_tokens"), false, nil
}

// abortRoom tells the prefill engine at addr that the decode request of room gave up, best
// effort: SGLang's receiver sends the same notification when its request is aborted.
func (e *Engine) abortRoom(addr string, room []byte) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + "/room/abort")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetConnectionClose()
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(append(append([]byte(`{"room":`), room...), '}'))
	_ = roundTrip(addr, req, resp, time.Second)
}
