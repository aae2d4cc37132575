package clientconn

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

func (l *Limiter) parkedConns() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.parked.n
}

// TestParkTLS: over TLS, a parked connection serves its next request.
func TestParkTLS(t *testing.T) {
	l := testGlobalLimiter(t)
	s := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { fmt.Fprintf(ctx, "tls=%v", ctx.IsTLS()) }}
	l.serve = s.ServeConn
	c := serveTLS(t, l, s)
	t.Cleanup(func() { l.CloseParked(); l.parkers.Wait() })
	k := &keepAliveClient{c: c, br: bufio.NewReader(c)}
	for i := 0; i < 3; i++ {
		if got := k.exchange(t, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); got != "tls=true" {
			t.Fatalf("request %d: %q", i, got)
		}
		waitFor(t, 5*time.Second, "the connection to be parked", func() bool {
			l.ParkIdle(time.Now().Add(time.Hour))
			return l.parkedConns() == 1
		})
	}
	if got := l.parks.Load(); got != 3 {
		t.Fatalf("%d parks, want 3", got)
	}
}

// TestHeadWaits: the wait for a request head goes on until its empty line - a CRLF CRLF, also when split over
// two reads - or headMax bytes of it; it ends with ErrBareLF at an empty line ended by a bare LF (which does not
// end fasthttp's read of a head) and with ErrNotRequest at bytes that cannot begin a request (notRequestLine).
func TestHeadWaits(t *testing.T) {
	for _, tc := range []struct {
		b       string
		from    int
		headMax int
		waits   bool
		err     error
	}{
		{"G", 0, 0, true, nil},
		{"GET / HTTP/1.1\r\nHost: x\r\n", 0, 0, true, nil},
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 0, 0, false, nil},
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 24, 0, false, nil}, // the last read brought "\n\r\n"
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 25, 0, false, nil}, // the last CRLF
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 26, 0, false, nil}, // and only its LF
		{"GET / HTTP/1.1\r\nHost: x\r\n\r", 25, 0, true, nil},
		{"GET / HTTP/1.1\r\nHost: x\r\n", 0, 20, false, nil}, // headMax bytes came: fasthttp refuses them
		{"GET / HTTP/1.1\nHost: x\n", 0, 0, true, nil},
		{"GET / HTTP/1.1\nHost: x\n\n", 0, 0, false, ErrBareLF},
		{"GET / HTTP/1.1\nHost: x\n\n", 23, 0, false, ErrBareLF}, // the last read brought the second LF
		{"GET / HTTP/1.1\r\nHost: x\r\n\n", 26, 0, false, ErrBareLF},
		{"GET / HTTP/1.1\nHost: x\n\r\n", 24, 0, false, ErrBareLF}, // "\n" then "\r\n" in a read of its own
		{"\r\nGET / HTTP/1.1\r\nHost: x", 0, 0, true, nil},
		{"\x16\x03\x01\x00", 0, 0, false, ErrNotRequest},
		{"", 0, 0, true, nil},
	} {
		c := clientConn{l: &Limiter{headMax: tc.headMax}}
		if waits := c.headWaits([]byte(tc.b), tc.from); waits != tc.waits || c.headErr != tc.err {
			t.Errorf("headWaits(%q, %d), headMax %d = %v, headErr %v; want %v, %v", tc.b, tc.from, tc.headMax, waits, c.headErr, tc.waits, tc.err)
		}
	}
	// What cannot begin a request line, and what can (or may yet).
	for b, want := range map[string]bool{
		"POST /v1/chat/completions HTTP/1.1\r\n": false,
		"\r\nGET / HTTP/1.1\r\n":                 false,
		"M-SEARCH * HTTP/1.1":                    false,
		"PO":                                     false,
		"":                                       false,
		"\x16\x03\x01\x00\xa5":                   true,
		" GET / HTTP/1.1":                        true,
		"GE(T / HTTP/1.1":                        true,
		"GET\t/ HTTP/1.1":                        true,
	} {
		if got := notRequestLine([]byte(b)); got != want {
			t.Errorf("notRequestLine(%q) = %v, want %v", b, got, want)
		}
	}
}

// TestWatchHead: the look at heads read straight into fasthttp's buffer, read by read: a head's end split
// between reads is found, whatever the reads' sizes, and what ended one head is no line end of the next.
func TestWatchHead(t *testing.T) {
	for _, tc := range []struct {
		reads []string
		want  error // after the last read; nil with inHead false: the head ended well
	}{
		{[]string{"GET / HTTP/1.1\r\nHost: x\r\n\r\n"}, nil},
		{[]string{"GET / HTTP/1.1\r\nHost: x\r", "\n\r\n"}, nil},
		{[]string{"GET / HTTP/1.1\r\nHost: x\r\n\r", "\n"}, nil},
		{[]string{"G", "ET / HTTP/1.1\r\nHost: x\r\n", "\r", "\n"}, nil},
		{[]string{"GET / HTTP/1.1\nHost: x\n", "\n"}, ErrBareLF},
		{[]string{"GET / HTTP/1.1\nHost: x", "\n", "\n"}, ErrBareLF},
		{[]string{"GET / HTTP/1.1\nHost: x\n", "\r", "\n"}, ErrBareLF},
		{[]string{"GET / HTTP/1.1\r\nA: b\r\n", "\r\n", "\nGET / HTTP/1.1\r\n", "Host: x\r\n\r\n"}, nil}, // the next head, after an empty line
		{[]string{"\x16\x03\x01\x00"}, ErrNotRequest},
		{[]string{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "\x16\x03"}, ErrNotRequest},
	} {
		var c clientConn
		for _, r := range tc.reads {
			c.watchHead([]byte(r))
		}
		if c.headErr != tc.want || (tc.want == nil && c.inHead) {
			t.Errorf("%q: headErr %v, inHead %v; want %v", tc.reads, c.headErr, c.inHead, tc.want)
		}
	}
}

// BenchmarkWatchHead: the look at a keep-alive connection's next request for a bare-LF head end, a chat
// request whose head and body came in one read.
func BenchmarkWatchHead(b *testing.B) {
	req := []byte(chatRequest())
	var c clientConn
	b.SetBytes(int64(len(req)))
	for i := 0; i < b.N; i++ {
		c.watchHead(req)
	}
	if c.inHead || c.headErr != nil {
		b.Fatal("the head's end was missed")
	}
}

// keepAliveClient is a client connection sending one request after another and reading each answer.
type keepAliveClient struct {
	c  net.Conn
	br *bufio.Reader
}

func (k *keepAliveClient) exchange(t *testing.T, req string) string {
	t.Helper()
	_ = k.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(k.c, req); err != nil {
		t.Fatalf("writing the request: %s", err)
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		t.Fatalf("reading the answer: %s", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("answer %d %q, %v", resp.StatusCode, b, err)
	}
	return string(b)
}

// chatRequest is a chat completion request for model "m", head and body, as a client sends it.
func chatRequest() string {
	body := `{"model":"m","stream":false,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`
	return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}
