package overhead

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

type streamResult struct {
	ttfb    float64   // µs to the first body byte
	gaps    []float64 // µs between consecutive deltas
	transit []float64 // µs from the upstream's send stamp to the client's read
}

// stream reads one paced SSE answer to body, of chunks deltas, through u and times its events as they arrive.
func (r *harness) stream(ctx context.Context, u unit, body []byte, chunks int) (streamResult, error) {
	var res streamResult
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r.addrs[u.key()]+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return res, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := streamClient.Do(req)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return res, fmt.Errorf("status %d", resp.StatusCode)
	}
	t := streamTimer{start: start}
	buf := make([]byte, 32<<10)
	for !t.done {
		n, err := resp.Body.Read(buf)
		now := time.Now()
		if n > 0 {
			t.feed(buf[:n], now)
		}
		if err != nil {
			if !t.done {
				return t.res, fmt.Errorf("stream ended after %d deltas: %w", t.deltas, err)
			}
			break
		}
	}
	res = t.res
	if t.deltas != chunks {
		return res, fmt.Errorf("got %d deltas, want %d", t.deltas, chunks)
	}
	// Read on past [DONE] to the end of the body, as the OpenAI SDKs do ("ensure the entire stream is
	// consumed"), so that the connection goes back to the client's pool: a body closed unread closes its
	// connection, and every stream would then pay a new connection to the path.
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return res, fmt.Errorf("after [DONE]: %w", err)
	}
	return res, nil
}

// streamTimer times the events of one SSE answer as its bytes arrive.
type streamTimer struct {
	res         streamResult
	start, last time.Time // the request's start; the last delta's arrival
	pending     []byte    // bytes read past the last whole event
	deltas      int
	done        bool // [DONE] arrived
}

// feed takes the bytes b read at now and times every whole event they complete, up to [DONE].
func (t *streamTimer) feed(b []byte, now time.Time) {
	if t.res.ttfb == 0 {
		t.res.ttfb = float64(now.Sub(t.start)) / float64(time.Microsecond)
	}
	t.pending = append(t.pending, b...)
	for {
		i := bytes.Index(t.pending, []byte("\n\n"))
		if i < 0 {
			return
		}
		ev := t.pending[:i]
		t.pending = t.pending[i+2:]
		if bytes.Equal(ev, []byte("data: [DONE]")) {
			t.done = true
			return
		}
		stamp, ok := deltaStamp(ev)
		if !ok {
			continue // the role and finish chunks
		}
		t.deltas++
		t.res.transit = append(t.res.transit, float64(now.UnixNano()-stamp)/1e3)
		if !t.last.IsZero() {
			t.res.gaps = append(t.res.gaps, float64(now.Sub(t.last))/float64(time.Microsecond))
		}
		t.last = now
	}
}

var streamClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}, Timeout: time.Minute}

// deltaStamp returns the send time a delta event carries as its content.
func deltaStamp(ev []byte) (int64, bool) {
	i := bytes.Index(ev, []byte(`"content":"`))
	if i < 0 {
		return 0, false
	}
	rest := ev[i+len(`"content":"`):]
	j := bytes.IndexByte(rest, '"')
	if j <= 0 {
		return 0, false
	}
	v, err := strconv.ParseInt(string(rest[:j]), 10, 64)
	return v, err == nil
}
