package engine

import (
	"bytes"
	"errors"
	"io"
	"strconv"
)

// What a disaggregated route changes in the decode engine's answer on its way to the client: a stream's
// first event is held back until it shows the decode started (holdFirstEvent), and the usage's
// cached_tokens are the prefill engine's (rewriteCached).

// maxHeldEvents bounds what holdFirstEvent reads ahead.
const maxHeldEvents = 64 << 10

// holdFirstEvent reads the decode engine's stream into c.respBuf until it holds a complete event that is
// not a chat stream's opening role chunk: vLLM sends that chunk, then an error event, when the decode
// engine could not read the transferred blocks (kv_load_failure_policy "fail"). It returns failAnswered
// when that first event is an error, so the attempt fails before the client got a byte and the request
// can be prefilled and decoded again; or what broke the stream off before such an event came.
func (c *call) holdFirstEvent() (failKind, error) {
	c.respBuf = c.respBuf[:0]
	scanned := 0
	for {
		for {
			end := eventEnd(c.respBuf[scanned:])
			if end < 0 {
				break
			}
			ev := c.respBuf[scanned : scanned+end]
			scanned += end
			if isRoleChunk(ev) {
				continue
			}
			if bytes.HasPrefix(bytes.TrimLeft(ev, " \r\n"), []byte(`data: {"error"`)) {
				return failAnswered, errDecodeError
			}
			return failNone, nil
		}
		if c.upstreamDone {
			return failNone, nil // the stream ended before such an event: what came is passed on as it is
		}
		more, err := c.readMore(maxHeldEvents)
		if err != nil && err != io.EOF {
			return classify(err), err
		}
		if !more {
			return failNone, nil // a long run of role chunks: passed on as it is
		}
	}
}

var errDecodeError = errors.New("the decode engine's stream began with an error event")

// eventEnd returns the length of the first complete SSE event of b, through its blank line, or -1.
func eventEnd(b []byte) int {
	if i := bytes.Index(b, []byte("\n\n")); i >= 0 {
		if j := bytes.Index(b[:i+1], []byte("\r\n\r\n")); j >= 0 {
			return j + 4
		}
		return i + 2
	}
	if j := bytes.Index(b, []byte("\r\n\r\n")); j >= 0 {
		return j + 4
	}
	return -1
}

// isRoleChunk reports whether ev is a chat stream's opening chunk: the assistant role with empty content
// and no finish reason, which vLLM sends before the first token (or the error).
func isRoleChunk(ev []byte) bool {
	return bytes.Contains(ev, []byte(`"role":"assistant"`)) && bytes.Contains(ev, []byte(`"content":""`)) &&
		!bytes.Contains(ev, []byte(`"finish_reason":"`))
}

var cachedTokensKey = []byte(`"cached_tokens":`)

// rewriteCached replaces the value of each "cached_tokens" key in b[:n] by cached, in place, and returns
// the new length; a value it cannot replace within len(b) - a longer number than the buffer has room
// for - or that spans two reads is left as it is. The decode engine counts the blocks it received as
// cached; the client's usage should say what the prefill engine reused (llm-d does the same).
func rewriteCached(b []byte, n int, cached int64) int {
	var num [20]byte
	val := strconv.AppendInt(num[:0], cached, 10)
	from := 0
	for {
		i := bytes.Index(b[from:n], cachedTokensKey)
		if i < 0 {
			return n
		}
		start := from + i + len(cachedTokensKey)
		for start < n && b[start] == ' ' {
			start++
		}
		end := start
		for end < n && b[end] >= '0' && b[end] <= '9' {
			end++
		}
		if end == start || end == n {
			return n // not a number, or one that may go on in the next read
		}
		delta := len(val) - (end - start)
		if n+delta > len(b) {
			return n
		}
		copy(b[end+delta:n+delta], b[end:n])
		copy(b[start:], val)
		n += delta
		from = end + delta
	}
}
