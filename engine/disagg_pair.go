package engine

import (
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/disagg"
)

// SGLang's protocol (disagg/doc.go, "SGLang: two requests at once"): the prefill engine and the decode
// engine get the client's request at once, each with the same bootstrap host, port and room, and meet in
// the room. The gateway writes both requests before it waits for either answer - a prefill engine may
// wait for its decode peer - then reads the prefill's answer whole (it ends once the prefill is done, as
// the decode's first token is about due) and streams the decode's. The two fail together: a prefill that
// fails, or a decode that fails before the client got a byte, ends the pair (the other connection is
// closed, which aborts it), and a retry is a new pair in a new room, on a decode engine not tried yet. A
// client that leaves closes the connection of the answer being waited for, and the pair with it.

// runPairs sends a request of an SGLang route as prefill/decode pairs until one answers (runPD's part for
// such a route). It answers and finishes the request, or leaves it streaming.
func (c *call) runPairs(ctx *fasthttp.RequestCtx) {
	pd := c.route.pd
	var last attemptResult
	c.tried = 0
	ti, k := -1, 0
	for pairs := 0; pairs <= c.snap.cfg.Retry.MaxRetries; {
		// A pair whose prefill failed moves to the next prefill target; one whose decode failed keeps it.
		if ti < 0 {
			if ti = c.nextTarget(k); ti < 0 {
				break
			}
			k++
		}
		pt := c.route.Targets[ti]
		if ok, left, busy := c.admitOrBusy(ctx, pt); !ok {
			if left {
				c.finish(c.status)
				return
			}
			last, ti = busy, -1
			continue
		}
		pprobe := c.probe
		di := pd.pickDecode(c.decodeTried, time.Now().UnixNano(), c.snap.cfg.Health.FailOpen)
		if di < 0 {
			c.probe = pprobe
			c.done(pt, failBusy, 0)
			break
		}
		c.decodeTried |= 1 << di
		dt := pd.decode[di]
		if !c.admit(dt) {
			c.probe = pprobe
			c.done(pt, failBusy, 0)
			last = attemptResult{kind: failBusy, err: c.busyError(dt)}
			continue
		}
		dprobe := c.probe
		if pairs > 0 {
			c.retriedOn(last.kind, pairs)
		}
		pairs++
		c.prefillT = nil
		out, res := c.pairOn(ctx, ti, dt, pprobe, dprobe)
		switch out {
		case outStreaming:
			return
		case outDone:
			c.finish(c.status)
			return
		}
		last = res
		if c.prefillT == nil {
			ti = -1
		}
	}
	c.answerFailure(ctx, last)
}

// pairOn sends one pair - prefill target ti and decode target dt, whose slots admit took (with the breaker
// probes pprobe and dprobe) - in a new room.
func (c *call) pairOn(ctx *fasthttp.RequestCtx, ti int, dt *Target, pprobe, dprobe bool) (outcome, attemptResult) {
	pd := c.route.pd
	pt := c.route.Targets[ti]
	c.suffix = disagg.AppendBootstrap(c.suffix[:0], c.obj, pt.Provider.up.host, pd.bootstrapPort, disagg.NewRoom())
	c.writeOnly = true
	c.target, c.hop, c.probe = pt, hopPrefill, pprobe
	pconn, out, res := c.send(ctx, ti)
	if pconn == nil {
		c.writeOnly = false
		c.probe = dprobe
		c.done(dt, failBusy, 0) // never sent: no failure of the decode engine's
		pd.m.PrefillFailed.Inc()
		return out, res
	}
	c.target, c.hop, c.probe = dt, hopDecode, dprobe
	dconn, out, res := c.send(ctx, dt.Index)
	c.writeOnly = false
	if dconn == nil {
		// The decode engine did not take its half: the prefill's is aborted, no failure of its own.
		pconn.close()
		c.probe = pprobe
		c.done(pt, failClient, 0)
		pd.m.DecodeFailed.Inc()
		return out, res
	}
	c.target, c.hop, c.probe = pt, hopPrefill, pprobe
	c.watch.setVictim(pconn)
	ok := false
	if out, res, ok = c.head(ctx, pconn, pt); ok {
		out, res, ok = c.readPrefillAnswer(ctx, pconn, pt)
	}
	if !ok {
		// The prefill failed (head and readPrefillAnswer recorded it): its decode half goes too.
		dconn.close()
		c.probe = dprobe
		c.done(dt, failClient, 0)
		pd.m.PrefillFailed.Inc()
		return out, res
	}
	pd.m.PrefillOK.Inc()
	c.prefilled(pt, c.respBuf)
	c.respBuf = c.respBuf[:0]
	c.target, c.hop, c.probe = dt, hopDecode, dprobe
	c.reached = true
	c.watch.setVictim(dconn)
	if out, res, ok := c.head(ctx, dconn, dt); !ok {
		pd.m.DecodeFailed.Inc()
		return out, res
	}
	out, res = c.succeed(ctx, dconn, dt)
	switch out {
	case outStreaming:
		pd.m.DecodeOK.Inc()
	case outRetry:
		pd.m.DecodeFailed.Inc()
	}
	return out, res
}
