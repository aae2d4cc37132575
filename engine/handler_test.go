package engine

import (
	"bufio"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestReqHeadersAsPeek: the values checkRequest collects in its one pass are what fasthttp's Peek returns
// for each name, whatever case the client wrote it in, the first of repeated ones, and "close" for a
// Connection header fasthttp keeps only as a flag.
func TestReqHeadersAsPeek(t *testing.T) {
	names := []string{"X-Request-Id", "X-Session-Id", "X-Rolter-Vllm-Token-Ids", "Authorization", "Traceparent", "Connection", "Expect"}
	for _, raw := range []string{
		"x-request-id: r1\r\nx-session-id: s1\r\nx-rolter-vllm-token-ids: 1,2\r\nauthorization: Bearer k\r\ntraceparent: 00-a-b-01\r\nconnection: keep-alive, x-foo\r\nexpect: 100-continue\r\n",
		"X-REQUEST-ID: r1\r\nX-Request-Id: r2\r\nAuthorization: one\r\nAUTHORIZATION: two\r\nConnection: close\r\n",
		"Connection: close, x-foo\r\nX-Other: 1\r\n",
		"Content-Type: application/json\r\n",
	} {
		var ctx fasthttp.RequestCtx
		text := "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n" + raw + "Content-Length: 2\r\n\r\n{}"
		if err := ctx.Request.Read(bufio.NewReader(strings.NewReader(text))); err != nil {
			t.Fatal(err)
		}
		var hs reqHeaders
		if e := checkRequest(&ctx, &hs); e != nil {
			t.Fatalf("%q: %+v", raw, e)
		}
		got := [][]byte{hs.requestID, hs.sessionID, hs.tokenIDs, hs.authorization, hs.traceparent, hs.connection, hs.expect}
		for i, name := range names {
			if want := ctx.Request.Header.Peek(name); string(got[i]) != string(want) {
				t.Errorf("%q: %s = %q, Peek gives %q", raw, name, got[i], want)
			}
		}
	}
}
