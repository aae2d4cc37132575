package engine

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The streaming contract on the wire: events reach the client as the upstream sends them, the headers
// before the first event, an unfinished stream as an error, and HTTP/1.0 clients without chunking.

// heldSSE is an SSE upstream that sends its headers and head at once, then tail once release is closed (it
// gives up after 10 s).
func heldSSE(head, tail string, release <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, head)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-time.After(10 * time.Second):
			return
		}
		fmt.Fprint(w, tail)
	}
}

// TestProxySSEUnbuffered: each event reaches the client before the upstream sends the next one.
func TestProxySSEUnbuffered(t *testing.T) {
	release := make(chan struct{})
	up := newFakeUpstream(t, heldSSE("data: {\"n\":1}\n\n", "data: {\"n\":2}\n\ndata: [DONE]\n\n", release))
	gw := startGateway(t, gatewayConfig("round_robin", "", up.URL))
	req, _ := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(chatBody("m", "hi", true)))
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	br := bufio.NewReader(resp.Body)
	first := make(chan string, 1)
	go func() {
		line, _ := br.ReadString('\n')
		first <- line
	}()
	select {
	case line := <-first:
		if line != "data: {\"n\":1}\n" {
			t.Fatalf("first line %q", line)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("first SSE event did not arrive before the upstream finished: the gateway buffers")
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("stream tail %q", rest)
	}
}

// TestProxySSEHeadersBeforePrefill: when the upstream sends its headers and then prefills before the first
// event, the client gets the status and headers at once, not with the first token: a long prefill must not
// look like a dead gateway. (When the first event comes with the headers, both leave in one write.)
func TestProxySSEHeadersBeforePrefill(t *testing.T) {
	release := make(chan struct{})
	up := newFakeUpstream(t, heldSSE("", "data: {\"n\":1}\n\ndata: [DONE]\n\n", release))
	gw := startGateway(t, gatewayConfig("round_robin", "", up.URL))
	req, _ := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(chatBody("m", "hi", true)))
	got := make(chan *http.Response, 1)
	go func() {
		resp, err := testClient.Do(req)
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- resp
	}()
	var resp *http.Response
	select {
	case resp = <-got:
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("the headers waited for the first event")
	}
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	close(release)
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
}

// TestTruncatedStreamIsAnError: a stream the upstream ends cleanly but without [DONE] reaches the client
// with an error event, not as a success.
func TestTruncatedStreamIsAnError(t *testing.T) {
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"n\":1}\n\n") // ends cleanly but without [DONE]
	})
	gw := startGateway(t, gatewayConfig("round_robin", "", up.URL))
	_, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "hi", true))
	if !strings.Contains(got, `data: {"error":{`) || strings.Contains(got, "[DONE]") {
		t.Fatalf("truncated stream passed as success: %q", got)
	}
}

// TestHTTP10StreamIsNotChunked: HTTP/1.0 has no chunked encoding; a stream to an HTTP/1.0 client is sent
// as it comes and ends with the connection.
func TestHTTP10StreamIsNotChunked(t *testing.T) {
	up := newFakeUpstream(t, sseEvents(3, 10*time.Millisecond))
	gw := startGateway(t, gatewayConfig("round_robin", "", up.URL))
	body := chatBody("m", "x", true)
	c, br := rawRequest(t, gw.addr, "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	all, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("reading until the connection closed: %s", err)
	}
	head, payload, _ := strings.Cut(string(all), "\r\n\r\n")
	if !strings.HasPrefix(head, "HTTP/1.0 200") || strings.Contains(strings.ToLower(head), "transfer-encoding") ||
		!strings.Contains(strings.ToLower(head), "text/event-stream") {
		t.Fatalf("head %q", head)
	}
	if !strings.HasPrefix(payload, "data: {") || !strings.HasSuffix(payload, "data: [DONE]\n\n") || strings.Count(payload, "chat.completion.chunk") != 3 {
		t.Fatalf("payload is not the plain event stream: %q", payload)
	}
}
