package engine

import (
	"bytes"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// The response stream: once an attempt succeeded (proxy.go), the call is the body stream the server
// copies to the client (Read), and the server closes it when the response is written or failed
// (CloseWithError), which ends the request (finish). An HTTP/1.0 client of a body of unknown length gets
// it unframed (streamHTTP10).

// Read is the body stream the server copies to the client. Each upstream read is returned as is, so the
// server writes and flushes it as one chunk: SSE events reach the client as the engine produces them.
// A stream that fails after its first byte ends with an SSE error event and no [DONE], on which the OpenAI
// SDKs raise (openai-python src/openai/_streaming.py); a non-SSE body that fails ends with an error, so the
// server closes the connection and the client sees a truncated response rather than a clean one.
func (c *call) Read(p []byte) (int, error) {
	if c.respOff < len(c.respBuf) {
		n := copy(p, c.respBuf[c.respOff:])
		if c.respOff == 0 {
			c.firstByte()
		}
		c.respOff += n
		c.bytesOut += int64(n)
		c.keepTail(p[:n])
		c.usage.feed(p[:n])
		c.countEvents(p[:n])
		return n, nil
	}
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	if c.pendingErr != nil {
		return 0, c.endWithError(c.pendingErr)
	}
	if c.streamFail != failNone {
		return 0, io.EOF
	}
	if c.upstreamDone {
		return c.endOfStream()
	}
	n, err := c.bodyStream.Read(p)
	if n > 0 && c.hop == hopDecode && c.prefillT != nil && c.pdUsage.hasCached {
		n = rewriteCached(p, n, c.pdUsage.cached)
	}
	if n > 0 {
		if !c.gotFirst {
			c.firstByte()
		}
		c.bytesOut += int64(n)
		c.keepTail(p[:n])
		c.usage.feed(p[:n])
		c.countEvents(p[:n])
		if err != nil && err != io.EOF {
			c.pendingErr = err
		} else if err == io.EOF {
			c.upstreamDone = true
		}
		return n, nil
	}
	if err == nil {
		return 0, nil
	}
	if err == io.EOF {
		c.upstreamDone = true
		return c.endOfStream()
	}
	return 0, c.endWithError(err)
}

// firstByte notes the response's first byte to the client.
func (c *call) firstByte() {
	c.gotFirst = true
	c.target.m.TTFB.UpdateDuration(c.sent)
	if c.obs != nil {
		c.firstAt = time.Now()
	}
}

// endOfStream ends a body the upstream finished cleanly.
func (c *call) endOfStream() (int, error) {
	if c.sse && !c.sawDone() {
		// The upstream ended the body but the SSE stream never finished: a truncated stream must not look
		// like a successful one, as a clean 200 would.
		return c.sseError(failReset, "upstream stream ended before its last event")
	}
	return 0, io.EOF
}

func (c *call) endWithError(err error) error {
	kind := classify(err)
	if c.watch.gone.Load() {
		kind = failClient
	}
	if c.sse {
		msg := "upstream stream failed: " + kind.String()
		if kind == failTimeout {
			msg = "upstream stream stalled longer than timeouts.idle_secs"
		}
		_, e := c.sseError(kind, msg)
		return e
	}
	c.streamFail = kind
	return err
}

// sseError queues a final `data: {"error":...}` event and returns its first bytes.
func (c *call) sseError(kind failKind, msg string) (int, error) {
	c.streamFail = kind
	status, code := fasthttp.StatusBadGateway, "upstream_stream_error"
	if kind == failTimeout {
		status, code = fasthttp.StatusGatewayTimeout, "upstream_timeout"
	}
	e := apiError{status: status, typ: typeServer, code: code, message: msg}
	var ev []byte
	if !c.atEventBoundary() {
		ev = append(ev, "\n\n"...)
	}
	ev = append(ev, "data: "...)
	ev = e.appendBody(ev)
	ev = append(ev, "\n\n"...)
	c.pending = ev
	return 0, nil
}

func (c *call) keepTail(b []byte) {
	const keep = 32
	if len(b) >= keep {
		c.tail = append(c.tail[:0], b[len(b)-keep:]...)
		return
	}
	if over := len(c.tail) + len(b) - keep; over > 0 {
		c.tail = append(c.tail[:0], c.tail[over:]...)
	}
	c.tail = append(c.tail, b...)
}

func (c *call) sawDone() bool {
	return bytes.Contains(c.tail, []byte("data: [DONE]")) || bytes.Contains(c.tail, []byte("data:[DONE]"))
}

func (c *call) atEventBoundary() bool {
	return len(c.tail) == 0 || bytes.HasSuffix(c.tail, []byte("\n\n")) || bytes.HasSuffix(c.tail, []byte("\r\n\r\n"))
}

// CloseWithError is called by the server once the response is written (err == nil) or failed (err is the
// write error, typically the client having gone away). It returns the upstream connection to the pool only
// when its response was read whole; otherwise it closes it, which tells the engine to stop generating.
func (c *call) CloseWithError(err error) error {
	if c.closed {
		return nil
	}
	c.closed = true
	gone := c.watch.disarm()
	c.releaseConn(c.upstreamDone && c.streamFail == failNone && err == nil && !gone)
	p := c.target.Provider
	p.adm.release(p.inflight)
	if lr := c.route.lora; lr != nil {
		lr.done(c.target.Index)
	}
	if c.streamFail != failNone && c.streamFail != failClient && !(err != nil || gone) {
		p.health.failure(time.Now().UnixNano(), false, c.streamFail, 0)
	}
	status := c.status
	switch {
	case err != nil || gone || c.streamFail == failClient:
		status = statusClientClosed
		c.route.m.ClientGone.Inc()
	case c.streamFail != failNone:
		c.target.m.StreamError(int(c.streamFail))
		status = fasthttp.StatusBadGateway
	}
	c.finish(status)
	return nil
}

var _ fasthttp.ReadCloserWithError = (*call)(nil)

// streamHTTP10 sends the response to an HTTP/1.0 client whose body length is unknown: without chunked
// encoding, as the bytes come, ending with the connection. It takes the connection over from the server.
func (c *call) streamHTTP10(ctx *fasthttp.RequestCtx) {
	h := &ctx.Response.Header
	var head []byte
	head = append(head, "HTTP/1.0 "...)
	head = strconv.AppendInt(head, int64(c.status), 10)
	head = append(head, ' ')
	head = append(head, fasthttp.StatusMessage(c.status)...)
	head = append(head, "\r\n"...)
	for k, v := range h.All() {
		if equalFold(k, "connection") || equalFold(k, "transfer-encoding") || equalFold(k, "content-length") {
			continue
		}
		head = append(head, k...)
		head = append(head, ": "...)
		head = append(head, v...)
		head = append(head, "\r\n"...)
	}
	head = append(head, "Connection: close\r\n\r\n"...)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(nc net.Conn) {
		_, err := nc.Write(head)
		buf := make([]byte, 16<<10)
		for err == nil {
			var n int
			n, err = c.Read(buf)
			if n > 0 {
				if _, werr := nc.Write(buf[:n]); werr != nil {
					err = werr
				}
			}
		}
		if err == io.EOF {
			err = nil
		}
		_ = c.CloseWithError(err)
	})
}
