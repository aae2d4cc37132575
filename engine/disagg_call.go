package engine

import (
	"errors"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/disagg"
	"github.com/rolter-ai/rolter/promptkey"
)

// A request of a disaggregated route ([routes.disaggregation]; docs/routing/disaggregation.md) is two
// requests. With vLLM's protocol the prefill engine - the route's strategy ranks the prefill pool, where the
// prompt cache is - gets the client's request as a prefill (prefillPhase), and its answer's
// kv_transfer_params go to the decode engine, chosen by load (pickDecode), with the client's request
// (decodeOn), whose answer is the client's. In order of what can fail:
//
//   - A prefill attempt that fails or times out moves to the next prefill target, within retry.max_retries;
//     a 4xx is the client's and is answered as it is. When no prefill engine answers, the decode engine
//     prefills the request itself: it is slower, not refused.
//   - A decode attempt that fails before the client got a byte moves to another decode target, never the
//     same one twice (no decode engine gets a request twice). If the failed engine had received the
//     request, it may have read the prompt's blocks, which frees them on the prefill engine: the next
//     decode attempt gets a fresh prefill first. A decode engine that cannot read the blocks answers an
//     error event inside a 200 stream (vLLM's kv_load_failure_policy "fail"), so a stream's first event is
//     held back until it shows whether the decode started (holdFirstEvent).
//   - After the first byte: the stream ends with the usual SSE error event.
//   - A client that leaves closes the connection of the hop in flight, which aborts it on its engine.
//
// A request the prefill would not help - a prompt under prefill_threshold_tokens, an endpoint other than
// chat and completions - goes to a decode engine alone (skipped), with kv_transfer_params null.

// hop is which request of a disaggregated route an attempt sends.
type hop uint8

const (
	hopWhole   hop = iota // the client's request as it is: routes that are not disaggregated
	hopPrefill            // the prefill request
	hopDecode             // the decode request, with the prefill's params or, skipped, none
)

// Reasons a request skips the prefill engine: skipNone, or one more than its index in
// telemetry.DisaggSkipReasons (the x-rolter-prefill-skipped header).
const (
	skipNone = iota
	skipShortPrompt
	skipEndpoint
	skipPrefillFailed
)

var skipNames = [...][]byte{skipShortPrompt: []byte("short_prompt"), skipEndpoint: []byte("endpoint"), skipPrefillFailed: []byte("prefill_failed")}

// runPD sends a request of a disaggregated route through its prefill and decode engines (run's part for
// such a route). It answers and finishes the request, or leaves it streaming.
func (c *call) runPD(ctx *fasthttp.RequestCtx) {
	pd := c.route.pd
	cfg := &c.snap.cfg.Retry
	c.watch.arm(ctx.Conn(), c.g.watchDelay, nil, ctx.Request.Header.IsHTTP11())
	if len(pd.decode) == 0 {
		c.watch.disarm()
		c.answerError(ctx, noEndpoints(c.route))
		return
	}
	c.skip = c.skipReason()
	if c.skip != skipNone {
		pd.m.Skipped(c.skip - 1)
	}
	if pd.sglang && c.skip == skipNone {
		c.runPairs(ctx)
		return
	}
	var last attemptResult
	decodes := 0
	for decodes <= cfg.MaxRetries {
		if c.skip == skipNone && c.prefillT == nil {
			out, res, ok := c.prefillPhase(ctx)
			if out == outDone {
				c.finish(c.status)
				return
			}
			if !ok {
				// No prefill engine answered: the decode engine prefills the request itself.
				c.skip = skipPrefillFailed
				pd.m.Skipped(skipPrefillFailed - 1)
				last = res
			}
		}
		di := pd.pickDecode(c.decodeTried, time.Now().UnixNano(), c.snap.cfg.Health.FailOpen)
		if di < 0 {
			break
		}
		c.decodeTried |= 1 << di
		t := pd.decode[di]
		if ok, left, busy := c.admitOrBusy(ctx, t); !ok {
			if left {
				c.finish(c.status)
				return
			}
			last = busy
			continue
		}
		if decodes > 0 {
			c.retriedOn(last.kind, decodes)
		}
		decodes++
		out, res := c.decodeOn(ctx, t)
		switch out {
		case outStreaming:
			pd.m.DecodeOK.Inc()
			return
		case outDone:
			c.finish(c.status)
			return
		}
		pd.m.DecodeFailed.Inc()
		last = res
		if c.reached && len(c.kvParams) > 0 {
			// The engine that failed had the params and may have read the blocks, which frees them on the
			// prefill engine: the next decode engine gets a fresh prefill.
			c.prefillT, c.kvParams = nil, c.kvParams[:0]
			pd.m.Reprefills.Inc()
		}
	}
	c.answerFailure(ctx, last)
}

// skipReason says why the request goes to a decode engine without a prefill, or skipNone.
func (c *call) skipReason() int {
	if c.ep != promptkey.Chat && c.ep != promptkey.Completions {
		// vLLM's protocol is that of these two endpoints (the Responses API limits tokens otherwise).
		return skipEndpoint
	}
	if len(c.key) < c.route.pd.thresholdBytes && !c.route.pd.sglang {
		// (An SGLang decode server cannot prefill without its peer: such routes pair every request.)
		// The decode engine's cache is not tracked, so the whole prompt counts as uncached there: a short
		// one is cheaper to prefill locally than to move.
		return skipShortPrompt
	}
	return skipNone
}

// retriedOn counts a retry (the n-th send of a hop) and waits its backoff.
func (c *call) retriedOn(kind failKind, n int) {
	c.retried(c.target, kind)
	c.retries++
	c.route.m.Retries.Inc()
	if c.retries == 1 {
		c.route.m.Retried.Inc()
	}
	if d := backoff(&c.snap.cfg.Retry, n); d > 0 {
		time.Sleep(d)
	}
}

// prefillPhase runs the prefill request on the ranked prefill targets until one answers with the params
// (ok), or answers the client itself (outDone: a 4xx, a client that left). Every prefill phase starts
// from the top of the ranking: the best prefill engine still holds the prefix after a decode failed.
func (c *call) prefillPhase(ctx *fasthttp.RequestCtx) (outcome, attemptResult, bool) {
	pd := c.route.pd
	var last attemptResult
	c.tried = 0
	ti, k := -1, 0
	for sent := 0; sent <= c.snap.cfg.Retry.MaxRetries; {
		if last.kind != failStale {
			if ti = c.nextTarget(k); ti < 0 {
				break
			}
			k++
		}
		t := c.route.Targets[ti]
		if ok, left, busy := c.admitOrBusy(ctx, t); !ok {
			if left {
				return outDone, attemptResult{}, false
			}
			last = busy
			continue
		}
		if sent > 0 {
			c.retriedOn(last.kind, sent)
		}
		sent++
		out, res, ok := c.prefillOn(ctx, ti)
		if ok {
			pd.m.PrefillOK.Inc()
			return 0, attemptResult{}, true
		}
		if out == outDone {
			return out, res, false
		}
		pd.m.PrefillFailed.Inc()
		last = res
	}
	return outRetry, last, false
}

// prefillOn sends the prefill request to prefill target ti (whose slot admit took) and reads its answer
// whole: on success c.kvParams holds the params for the decode request (empty when the answer had none:
// the engine kept no blocks, and the decode engine prefills) and c.prefillT the target.
func (c *call) prefillOn(ctx *fasthttp.RequestCtx, ti int) (outcome, attemptResult, bool) {
	t := c.route.Targets[ti]
	c.target, c.hop = t, hopPrefill
	c.suffix = disagg.AppendPrefill(c.suffix[:0], c.obj)
	conn, out, res := c.send(ctx, ti)
	if conn == nil {
		return out, res, false
	}
	if out, res, ok := c.head(ctx, conn, t); !ok {
		return out, res, false
	}
	if out, res, ok := c.readPrefillAnswer(ctx, conn, t); !ok {
		return out, res, false
	}
	answer := c.respBuf
	c.respBuf = c.respBuf[:0]
	params, err := disagg.ParsePrefillAnswer(answer)
	switch {
	case err == nil:
		// Counted whole in the body memory, like the request's other buffers (a pooled call keeps it).
		if !c.hold(max(len(params), cap(c.kvParams))) {
			out, res := c.fail(ctx, t, nil, failProto, errPrefillAnswerSize)
			return out, res, false
		}
		c.kvParams = append(c.kvParams[:0], params...)
		c.route.pd.m.Params(0)
	case errors.Is(err, disagg.ErrNoKVTransferParams):
		c.kvParams = c.kvParams[:0]
		c.route.pd.m.Params(1)
	default:
		c.route.pd.m.Params(2)
		out, res := c.fail(ctx, t, nil, failProto, err)
		return out, res, false
	}
	c.prefilled(t, answer)
	return 0, attemptResult{}, true
}

// readPrefillAnswer reads the prefill engine's answer, whose head was read, whole into c.respBuf and gives
// the connection back. ok is false when it could not, and the attempt failed (or the client left).
func (c *call) readPrefillAnswer(ctx *fasthttp.RequestCtx, conn *uconn, t *Target) (outcome, attemptResult, bool) {
	c.bodyStream = conn.resp.BodyStream()
	var err error
	kind := failProto
	if c.bodyStream == nil {
		err = errNoPrefillAnswer
	} else {
		conn.startBody()
		c.conn = conn
		if kind, err = c.prefetch(); kind == failNone && !c.upstreamDone {
			kind, err = failProto, errPrefillAnswerSize
		}
	}
	if kind != failNone {
		c.conn, c.bodyStream, c.upstreamDone = nil, nil, false
		conn.close()
		c.watch.setVictim(nil)
		if c.watch.gone.Load() {
			out, res := c.clientLeft(ctx, t)
			return out, res, false
		}
		out, res := c.fail(ctx, t, nil, kind, err)
		return out, res, false
	}
	c.releaseConn(true)
	c.bodyStream, c.upstreamDone = nil, false
	return 0, attemptResult{}, true
}

// prefilled records prefill target t's successful answer: its slot and health, its usage - the request's:
// the decode engine counts the blocks it received as cached - and the target itself.
func (c *call) prefilled(t *Target, answer []byte) {
	c.usage.feed(answer)
	c.pdUsage = c.usage.figures()
	c.usage.reset()
	c.done(t, failNone, 0)
	t.m.Request(c.status)
	c.prefillT = t
}

// decodeOn sends the decode request to decode target t (whose slot admit took): the client's request with
// the prefill's params, or with none when the prefill was skipped or kept nothing.
func (c *call) decodeOn(ctx *fasthttp.RequestCtx, t *Target) (outcome, attemptResult) {
	c.target, c.hop = t, hopDecode
	var params []byte
	if len(c.kvParams) > 0 {
		params = c.kvParams
	}
	c.suffix = disagg.AppendDecode(c.suffix[:0], c.obj, params)
	c.reached = false
	conn, out, res := c.send(ctx, t.Index)
	if conn == nil {
		return out, res
	}
	c.reached = true
	if out, res, ok := c.head(ctx, conn, t); !ok {
		return out, res
	}
	return c.succeed(ctx, conn, t)
}

var (
	errNoPrefillAnswer   = errors.New("prefill answer has no body")
	errPrefillAnswerSize = errors.New("prefill answer is larger than the gateway reads ahead")
)
