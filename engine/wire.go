package engine

import (
	"bytes"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// The wire format the gateway writes and reads by hand: the upstream request (writeRequest), which of the
// client's request headers pass upstream and which of the upstream's response headers pass back, an
// upstream's error answer (readUpstreamError) and its retry-after, and the names of the headers the
// gateway sets on its answers.

// Request header names the gateway never forwards: hop-by-hop headers (RFC 9110 section 7.6.1), the ones it
// writes itself, and its own x-rolter-* controls.
func skipRequestHeader(k []byte) bool {
	switch len(k) {
	case 2:
		return equalFold(k, "te")
	case 4:
		return equalFold(k, "host")
	case 6:
		return equalFold(k, "expect")
	case 7:
		return equalFold(k, "trailer") || equalFold(k, "upgrade")
	case 10:
		return equalFold(k, "connection") || equalFold(k, "keep-alive")
	case 12:
		return equalFold(k, "x-request-id")
	case 14:
		return equalFold(k, "content-length")
	case 15:
		return equalFold(k, "accept-encoding")
	case 17:
		return equalFold(k, "transfer-encoding")
	}
	return hasPrefixFold(k, "proxy-") || hasPrefixFold(k, "x-rolter-")
}

// skipResponseHeader lists upstream response headers the gateway does not copy.
func skipResponseHeader(k []byte) bool {
	switch len(k) {
	case 2:
		return equalFold(k, "te")
	case 4:
		return equalFold(k, "date")
	case 7:
		return equalFold(k, "trailer") || equalFold(k, "upgrade")
	case 10:
		return equalFold(k, "connection") || equalFold(k, "keep-alive")
	case 12:
		return equalFold(k, "content-type") || equalFold(k, "x-request-id")
	case 14:
		return equalFold(k, "content-length")
	case 17:
		return equalFold(k, "transfer-encoding")
	}
	return hasPrefixFold(k, "proxy-")
}

func equalFold(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

func hasPrefixFold(b []byte, lower string) bool {
	return len(b) >= len(lower) && equalFold(b[:len(lower)], lower)
}

// writeRequest writes the upstream request and waits until its answer can be read (uconn.flushAndWait). The
// body is the client's, with the value of "model" replaced by t.Model (as a JSON string) unless it already
// is that, the rest byte for byte. Client headers are passed on except hop-by-hop ones (those named in
// Connection too) and those the provider sets itself: its configured headers and, when api_key_env is set,
// Authorization. X-Forwarded-For gets the client's address appended.
func (c *call) writeRequest(ctx *fasthttp.RequestCtx, conn *uconn, t *Target) error {
	p := t.Provider
	_ = conn.wd.SetAfter(c.sent, p.up.headersWait, conn.nc.SetWriteDeadline)
	bw := conn.bw
	c.path = p.up.requestPath(c.path[:0], ctx.Path())
	if qs := ctx.URI().QueryString(); len(qs) > 0 {
		c.path = append(c.path, '?')
		c.path = append(c.path, qs...)
	}
	bw.WriteString("POST ")
	bw.Write(c.path)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(p.up.hostHeader)
	// The hop list goes on with this gateway's id (loop.go), first, so that it is the X-Rolter-Hop the next
	// gateway reads; the client's is skipped below with the other x-rolter-* headers.
	bw.WriteString("\r\n" + hopHeader + ": ")
	if len(c.hdr.hop) > 0 {
		bw.Write(c.hdr.hop)
		bw.WriteString(", ")
	}
	bw.WriteString(c.g.hopID)
	bw.WriteString("\r\n")
	hasCT := false
	var xff []byte
	connTokens := c.hdr.connection
	for k, v := range ctx.Request.Header.All() {
		if skipRequestHeader(k) || ((p.auth != nil || c.stripAuth) && equalFold(k, "authorization")) || p.setsHeader(k) ||
			(len(connTokens) > 0 && listsToken(connTokens, k)) {
			continue
		}
		if equalFold(k, "x-forwarded-for") {
			xff = v
			continue
		}
		if c.traced && equalFold(k, "traceparent") {
			continue // replaced by the gateway's span below
		}
		if equalFold(k, "content-type") {
			hasCT = true
		}
		writeHeader(bw, k, v)
	}
	if !hasCT {
		bw.WriteString("Content-Type: application/json\r\n")
	}
	if p.auth != nil {
		bw.WriteString("Authorization: ")
		bw.Write(p.auth)
		bw.WriteString("\r\n")
	}
	for _, h := range p.headers {
		bw.WriteString(h[0])
		bw.WriteString(": ")
		bw.WriteString(h[1])
		bw.WriteString("\r\n")
	}
	if !p.setsXFF {
		bw.WriteString("X-Forwarded-For: ")
		if len(xff) > 0 {
			bw.Write(xff)
			bw.WriteString(", ")
		}
		c.scratch = appendClientIP(c.scratch[:0], ctx)
		bw.Write(c.scratch)
		bw.WriteString("\r\n")
	}
	if c.traced {
		bw.WriteString("Traceparent: ")
		c.scratch = c.appendTraceparent(c.scratch[:0])
		bw.Write(c.scratch)
		bw.WriteString("\r\n")
	}
	bw.WriteString("X-Request-Id: ")
	bw.Write(c.reqID)
	body := c.reqBody
	ms, me := c.modelAt[0], c.modelAt[1]
	size := len(body) + len(c.suffix)
	splice := !bytes.Equal(body[ms:me], t.modelJSON)
	if splice {
		size += len(t.modelJSON) - (me - ms)
	}
	bw.WriteString("\r\nContent-Length: ")
	c.scratch = strconv.AppendInt(c.scratch[:0], int64(size), 10)
	bw.Write(c.scratch)
	bw.WriteString("\r\n\r\n")
	rest := body
	if splice {
		bw.Write(body[:ms])
		bw.Write(t.modelJSON)
		rest = body[me:]
	}
	if c.hop != hopWhole {
		// A disaggregated route's hop: its members go before the body's closing brace (disagg.Object).
		end := c.obj.End - (len(body) - len(rest))
		bw.Write(rest[:end])
		bw.Write(c.suffix)
		rest = rest[end:]
	}
	bw.Write(rest)
	if c.writeOnly {
		return conn.flush()
	}
	return conn.flushAndWait()
}

// appendClientIP appends the client's IP address (no port) to dst.
func appendClientIP(dst []byte, ctx *fasthttp.RequestCtx) []byte {
	switch a := ctx.RemoteAddr().(type) {
	case *net.TCPAddr:
		if ip4 := a.IP.To4(); ip4 != nil {
			for i, b := range ip4 {
				if i > 0 {
					dst = append(dst, '.')
				}
				dst = strconv.AppendUint(dst, uint64(b), 10)
			}
			return dst
		}
		return append(dst, a.IP.String()...)
	}
	return append(dst, "unknown"...)
}

// listsToken reports whether the comma-separated header value list names token (case-insensitively).
func listsToken(list, token []byte) bool {
	for len(list) > 0 {
		i := bytes.IndexByte(list, ',')
		item := list
		if i >= 0 {
			item, list = list[:i], list[i+1:]
		} else {
			list = nil
		}
		item = bytes.TrimSpace(item)
		if len(item) == len(token) && bytes.EqualFold(item, token) {
			return true
		}
	}
	return false
}

func writeHeader(bw interface {
	Write([]byte) (int, error)
	WriteString(string) (int, error)
}, k, v []byte) {
	bw.Write(k)
	bw.WriteString(": ")
	bw.Write(v)
	bw.WriteString("\r\n")
}

// readUpstreamError reads (at most 64 KiB of) an upstream error body, returns the connection to the pool
// when the body was read whole, and normalises the body to OpenAI's error shape.
func (c *call) readUpstreamError(conn *uconn, t *Target) *apiError {
	resp := &conn.resp
	conn.startBody()
	c.errBuf = c.errBuf[:0]
	r := resp.BodyStream()
	complete := false
	if r == nil {
		complete = true
	} else {
		var buf [4096]byte
		for len(c.errBuf) < 64<<10 {
			n, err := r.Read(buf[:])
			c.errBuf = append(c.errBuf, buf[:n]...)
			if err == io.EOF {
				complete = true
				break
			}
			if err != nil {
				break
			}
		}
	}
	e := normaliseUpstreamError(c.status, c.errBuf)
	if c.status >= 500 {
		c.g.log.Debug("upstream error answer", "request_id", string(c.reqID), "target", t.Provider.Name,
			"status", c.status, "body", sanitiseText(c.errBuf))
	}
	closing := resp.ConnectionClose()
	_ = resp.CloseBodyStream()
	if complete && !closing {
		conn.up.release(conn)
	} else {
		conn.close()
	}
	return e
}

func retryAfterMs(h *fasthttp.ResponseHeader) int {
	if v := h.Peek("Retry-After-Ms"); len(v) > 0 {
		if ms, err := strconv.ParseFloat(string(v), 64); err == nil && ms > 0 {
			return int(ms)
		}
	}
	if v := h.Peek("Retry-After"); len(v) > 0 {
		if s, err := strconv.ParseFloat(string(v), 64); err == nil && s > 0 {
			return int(s * 1000)
		}
		if t, err := time.Parse(time.RFC1123, string(v)); err == nil {
			if d := time.Until(t); d > 0 {
				return int(d / time.Millisecond)
			}
		}
	}
	return 0
}

// Header names, already in canonical form so fasthttp does not normalise them per request.
var (
	hdrRequestID   = []byte("X-Request-Id")
	hdrRoute       = []byte("X-Rolter-Route")
	hdrStrategy    = []byte("X-Rolter-Strategy")
	hdrDecision    = []byte("X-Rolter-Decision")
	hdrPrefixMatch = []byte("X-Rolter-Prefix-Match")
	hdrProvider    = []byte("X-Rolter-Provider")
	hdrTarget      = []byte("X-Rolter-Target")
	hdrRetries     = []byte("X-Rolter-Retries")
	// A disaggregated route's: the prefill engine of the answer, or why there was none.
	hdrPrefillTarget  = []byte("X-Rolter-Prefill-Target")
	hdrPrefillSkipped = []byte("X-Rolter-Prefill-Skipped")
)
