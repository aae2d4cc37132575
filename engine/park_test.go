package engine

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

func (l *connLimiter) parkedConns() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.parked.n
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

func chatRequest() string {
	body := chatBody("m", "hi", false)
	return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// TestIdleConnsPark: fasthttp keeps a connection's max_header_bytes read buffer between requests when it
// streams request bodies. Parked keep-alive connections give it back, and their request context: 200 of
// them, one request served on each, hold a few KiB of heap each, a fraction of what they held unparked (64
// KiB and more). Each then serves its next request and parks again; shutdown closes parked connections and
// leaves no goroutine behind. (The gateway's janitor parks connections idle for Options.ParkAfter; here the
// test parks them.)
func TestIdleConnsPark(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGatewayWith(t, gatewayConfig("round_robin", "", up.URL), Options{ParkAfter: time.Hour})
	l := gw.g.clients
	req := chatRequest()
	const n = 200
	warmUp(t, gw, req)
	before, stackBefore := heapInUse(), stackInUse()
	clients := make([]*keepAliveClient, n)
	for i := range clients {
		clients[i] = newKeepAliveClient(t, gw.addr, 512)
		clients[i].exchange(t, req)
	}
	parkAll := func(what string) {
		waitFor(t, 10*time.Second, what, func() bool {
			l.parkIdle(time.Now().Add(2 * time.Hour))
			return l.parkedConns() == n
		})
	}
	runtime.GC()
	held, heldStack := (heapInUse()-before)/n, (stackInUse()-stackBefore)/n
	parkAll("every idle connection to be parked")
	runtime.GC()
	parked, parkedStack := (heapInUse()-before)/n, (stackInUse()-stackBefore)/n
	t.Logf("per idle keep-alive connection, client side included: %d bytes of heap and %d of stacks, %d and %d once parked",
		held, heldStack, parked, parkedStack)
	if parked > 16<<10 || held-parked < 32<<10 {
		t.Fatalf("heap per idle connection: %d bytes, %d parked: fasthttp's buffers were kept", held, parked)
	}

	for _, k := range clients {
		k.exchange(t, req)
	}
	parkAll("every connection to be parked again")
	if got := l.parks.Load(); got != 2*n {
		t.Fatalf("%d parks, want %d", got, 2*n)
	}
	if _, text := getMetrics(t, gw); metricValue(text, "rolter_client_connections_parked") != n {
		t.Fatalf("rolter_client_connections_parked %v, want %d", metricValue(text, "rolter_client_connections_parked"), n)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := gw.g.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for i, k := range clients {
		k.closed(t, 5*time.Second, fmt.Sprintf("connection %d after shutdown", i))
	}
	if got := l.openConns(); got != 0 {
		t.Fatalf("%d client connections open after shutdown", got)
	}
	if s := goroutines(); strings.Contains(s, "(*clientConn).park") {
		t.Fatalf("a park goroutine outlived shutdown:\n%s", s)
	}
}

// warmUp serves req on a connection of its own and closes it, so that the server's pools and lazily made
// state exist before a test measures the heap per connection, and collects garbage once (pooled objects
// survive one collection; heapInUse makes the second).
func warmUp(t *testing.T, gw *testGateway, req string) {
	t.Helper()
	warm := newKeepAliveClient(t, gw.addr, 512)
	warm.exchange(t, req)
	warm.c.Close()
	waitFor(t, 5*time.Second, "the warm-up connection to close", func() bool { return gw.g.clients.openConns() == 0 })
	runtime.GC()
}

func stackInUse() int64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.StackInuse)
}

func goroutines() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// parkedClient starts a gateway (with serverLines in [server]) that parks connections idle for 100 ms, and
// returns it with a client whose connection has served one request and is parked.
func parkedClient(t *testing.T, serverLines string) (*testGateway, *keepAliveClient) {
	t.Helper()
	up := newFakeUpstream(t, okJSON)
	gw := startGatewayWith(t, withServer(gatewayConfig("round_robin", "", up.URL), serverLines), Options{ParkAfter: 100 * time.Millisecond})
	k := newKeepAliveClient(t, gw.addr, 4096)
	k.exchange(t, chatRequest())
	waitFor(t, 5*time.Second, "the connection to be parked", func() bool { return gw.g.clients.parkedConns() == 1 })
	return gw, k
}

func newKeepAliveClient(t *testing.T, addr string, bufSize int) *keepAliveClient {
	c := dial(t, addr)
	return &keepAliveClient{c: c, br: bufio.NewReaderSize(c, bufSize)}
}

// closed fails the test unless the gateway ends k's connection within d.
func (k *keepAliveClient) closed(t *testing.T, d time.Duration, what string) {
	t.Helper()
	_ = k.c.SetReadDeadline(time.Now().Add(d))
	if b, err := k.br.ReadByte(); err != io.EOF {
		t.Fatalf("%s: %q, %v; want the end of the connection", what, b, err)
	}
}

// TestParkedConnIdleTimeout: the janitor parks a connection idle for Options.ParkAfter, and a parked
// connection is closed at idle_timeout_secs, as an unparked one is.
func TestParkedConnIdleTimeout(t *testing.T) {
	gw, k := parkedClient(t, "idle_timeout_secs = 1\n")
	k.closed(t, 10*time.Second, "a parked connection past the idle timeout")
	waitFor(t, 5*time.Second, "the connection to be released", func() bool { return gw.g.clients.openConns() == 0 })
}

// TestParkedConnReclaimed: at max_conns a parked connection is reclaimed for a newcomer like any idle one.
func TestParkedConnReclaimed(t *testing.T) {
	gw, k := parkedClient(t, "max_conns = 1\n")
	newKeepAliveClient(t, gw.addr, 4096).exchange(t, chatRequest())
	k.closed(t, 5*time.Second, "the parked connection at max_conns")
	if got := gw.g.clients.reclaimed.Load(); got != 1 {
		t.Fatalf("%d reclaimed, want 1", got)
	}
	// The scrape's connection reclaims the newcomer's in turn, parked or not.
	if _, text := getMetrics(t, gw); metricValue(text, "rolter_client_connections_parked") != 0 {
		t.Fatalf("rolter_client_connections_parked %v after the parked connections were reclaimed", metricValue(text, "rolter_client_connections_parked"))
	}
}

// TestParkTLS: over TLS, a parked connection serves its next request.
func TestParkTLS(t *testing.T) {
	l := testGlobalLimiter(t)
	s := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { fmt.Fprintf(ctx, "tls=%v", ctx.IsTLS()) }}
	l.serve = s.ServeConn
	c := serveTLS(t, l, s)
	t.Cleanup(func() { l.closeParked(); l.parkers.Wait() })
	k := &keepAliveClient{c: c, br: bufio.NewReader(c)}
	for i := 0; i < 3; i++ {
		if got := k.exchange(t, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); got != "tls=true" {
			t.Fatalf("request %d: %q", i, got)
		}
		waitFor(t, 5*time.Second, "the connection to be parked", func() bool {
			l.parkIdle(time.Now().Add(time.Hour))
			return l.parkedConns() == 1
		})
	}
	if got := l.parks.Load(); got != 3 {
		t.Fatalf("%d parks, want 3", got)
	}
}

// TestParkRaces: clients whose requests come around the park delay - some just before the janitor wakes
// their connection, some just after, some two pipelined at once - are all answered, in order, on their own
// connection.
func TestParkRaces(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGatewayWith(t, gatewayConfig("round_robin", "", up.URL), Options{ParkAfter: 5 * time.Millisecond})
	req := chatRequest()
	const clients = 32
	deadline := time.Now().Add(2 * time.Second)
	errs := make(chan error, clients)
	for i := 0; i < clients; i++ {
		go func(i int) {
			c, err := net.Dial("tcp", gw.addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			br := bufio.NewReader(c)
			for j := 0; time.Now().Before(deadline); j++ {
				time.Sleep(time.Duration((i*7+j*13)%12) * time.Millisecond)
				n := 1 + (i+j)%3/2 // every third exchange pipelines two requests
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.WriteString(c, strings.Repeat(req, n)); err != nil {
					errs <- fmt.Errorf("client %d exchange %d: write: %w", i, j, err)
					return
				}
				for k := 0; k < n; k++ {
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						errs <- fmt.Errorf("client %d exchange %d answer %d: %w", i, j, k, err)
						return
					}
					b, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != 200 || !strings.Contains(string(b), "chat.completion") {
						errs <- fmt.Errorf("client %d exchange %d answer %d: %d %q %v", i, j, k, resp.StatusCode, b, err)
						return
					}
				}
			}
			errs <- nil
		}(i)
	}
	for i := 0; i < clients; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if gw.g.clients.parks.Load() == 0 {
		t.Fatal("no connection was parked")
	}
	t.Logf("%d parks", gw.g.clients.parks.Load())
}

// TestSlowHeadsHoldNoReadBuffer: a connection whose request head arrives slowly holds what it has received,
// not fasthttp's max_header_bytes read buffer: 200 fresh connections that each sent the start of a head
// hold a few hundred bytes of heap each (64 KiB and more each when the server reads heads as they come).
// Each then sends the rest of its head and is answered; so is a head sent a byte at a time.
func TestSlowHeadsHoldNoReadBuffer(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGatewayWith(t, gatewayConfig("round_robin", "", up.URL), Options{ParkAfter: time.Hour})
	l := gw.g.clients
	req := chatRequest()
	cut := strings.Index(req, "Content-Type")
	const n = 200
	warmUp(t, gw, req)
	before := heapInUse()
	clients := make([]*keepAliveClient, n)
	for i := range clients {
		clients[i] = newKeepAliveClient(t, gw.addr, 512)
		if _, err := io.WriteString(clients[i].c, req[:cut]); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 5*time.Second, "every connection to be admitted", func() bool { return l.openConns() == n })
	time.Sleep(300 * time.Millisecond) // nothing says when the gateway has read what was sent
	held := (heapInUse() - before) / n
	t.Logf("per connection with half a request head sent, client side included: %d bytes of heap", held)
	if held > 8<<10 {
		t.Fatalf("heap per connection with half a head: %d bytes: the read buffer was taken", held)
	}
	for _, k := range clients {
		if got := k.exchange(t, req[cut:]); !strings.Contains(got, "chat.completion") {
			t.Fatalf("answer %q", got)
		}
	}

	k := newKeepAliveClient(t, gw.addr, 512)
	for i := 0; i < len(req)-1; i++ {
		if _, err := io.WriteString(k.c, req[i:i+1]); err != nil {
			t.Fatal(err)
		}
		if i < cut+10 {
			time.Sleep(time.Millisecond)
		}
	}
	if got := k.exchange(t, req[len(req)-1:]); !strings.Contains(got, "chat.completion") {
		t.Fatalf("head sent a byte at a time: %q", got)
	}
}

// TestBareLFHeads: a request head whose lines end in a bare LF is answered 400 at once, where fasthttp alone
// waits for a CRLF CRLF until read_timeout_secs (60 s here): on a fresh connection, on a keep-alive one after
// a request, on a parked one, and when its empty line comes in a later read. The connection is closed after
// the answer.
func TestBareLFHeads(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGatewayWith(t, gatewayConfig("round_robin", "", up.URL), Options{ParkAfter: time.Hour})
	parking := startGatewayWith(t, gatewayConfig("round_robin", "", up.URL), Options{ParkAfter: 5 * time.Millisecond})
	body := chatBody("m", "hi", false)
	for _, head := range []string{
		"POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: %d\n\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\nContent-Length: %d\n\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\n",
		"POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Length: %d\n\r\n",
		"GET /health HTTP/1.1\nHost: x\n\n",
	} {
		req := head
		if strings.Contains(head, "%d") {
			req = fmt.Sprintf(head, len(body)) + body
		}
		for _, how := range []string{"fresh", "after a request", "split", "split after a request", "parked"} {
			addr := gw.addr
			if how == "parked" {
				addr = parking.addr
			}
			k := newKeepAliveClient(t, addr, 512)
			if how != "fresh" && how != "split" {
				k.exchange(t, chatRequest())
			}
			if how == "parked" {
				waitFor(t, 5*time.Second, "the connection to park", func() bool { return parking.g.clients.parkedConns() == 1 })
			}
			_ = k.c.SetDeadline(time.Now().Add(5 * time.Second))
			sent := req
			if strings.HasPrefix(how, "split") { // the head's last line end comes 50 ms after the rest
				cut := strings.LastIndex(head, "\n")
				if _, err := io.WriteString(k.c, req[:cut]); err != nil {
					t.Fatal(err)
				}
				time.Sleep(50 * time.Millisecond)
				sent = req[cut:]
			}
			if _, err := io.WriteString(k.c, sent); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(k.br, nil)
			if err != nil {
				t.Fatalf("%q, %s: %v (no answer before the client's 5 s deadline)", head, how, err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 400 || !strings.Contains(string(b), "bare LF") {
				t.Fatalf("%q, %s: answer %d %q, %v", head, how, resp.StatusCode, b, err)
			}
			k.closed(t, 5*time.Second, fmt.Sprintf("%q, %s", head, how))
			k.c.Close()
		}
	}
}

// TestNotHTTPAnsweredAtOnce: bytes that cannot begin a request line are answered 400 as soon as they come,
// where fasthttp alone waits for an end of line or CRLF CRLF until read_timeout_secs (60 s here): a TLS
// client sent to the plain port fails its handshake at once instead of hanging, and so do such bytes on a
// keep-alive connection. Empty lines before a request are still skipped.
func TestNotHTTPAnsweredAtOnce(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGatewayWith(t, gatewayConfig("round_robin", "", up.URL), Options{ParkAfter: time.Hour})
	tc := tls.Client(dial(t, gw.addr), &tls.Config{InsecureSkipVerify: true})
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("TLS handshake with the plain port: %v, want a failure before the client's 5 s deadline", err)
	}
	tc.Close()

	hello := "\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03"
	for _, how := range []string{"fresh", "after a request"} {
		k := newKeepAliveClient(t, gw.addr, 512)
		if how == "after a request" {
			k.exchange(t, chatRequest())
		}
		_ = k.c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(k.c, hello); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(k.br, nil)
		if err != nil {
			t.Fatalf("%s: %v (no answer before the client's 5 s deadline)", how, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(b), "request line") {
			t.Fatalf("%s: answer %d %q", how, resp.StatusCode, b)
		}
		k.closed(t, 5*time.Second, how)
		k.c.Close()
	}

	k := newKeepAliveClient(t, gw.addr, 512)
	if got := k.exchange(t, "\r\n"+chatRequest()); !strings.Contains(got, "chat.completion") {
		t.Fatalf("request after an empty line: %q", got)
	}
	if got := k.exchange(t, "\r\n"+chatRequest()); !strings.Contains(got, "chat.completion") {
		t.Fatalf("keep-alive request after an empty line: %q", got)
	}
}

// TestHeadWaits: the wait for a request head goes on until its empty line - a CRLF CRLF, also when split over
// two reads - or headMax bytes of it; it ends with errBareLF at an empty line ended by a bare LF (which does not
// end fasthttp's read of a head) and with errNotRequest at bytes that cannot begin a request (notRequestLine).
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
		{"GET / HTTP/1.1\nHost: x\n\n", 0, 0, false, errBareLF},
		{"GET / HTTP/1.1\nHost: x\n\n", 23, 0, false, errBareLF}, // the last read brought the second LF
		{"GET / HTTP/1.1\r\nHost: x\r\n\n", 26, 0, false, errBareLF},
		{"GET / HTTP/1.1\nHost: x\n\r\n", 24, 0, false, errBareLF}, // "\n" then "\r\n" in a read of its own
		{"\r\nGET / HTTP/1.1\r\nHost: x", 0, 0, true, nil},
		{"\x16\x03\x01\x00", 0, 0, false, errNotRequest},
		{"", 0, 0, true, nil},
	} {
		c := clientConn{l: &connLimiter{headMax: tc.headMax}}
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
		{[]string{"GET / HTTP/1.1\nHost: x\n", "\n"}, errBareLF},
		{[]string{"GET / HTTP/1.1\nHost: x", "\n", "\n"}, errBareLF},
		{[]string{"GET / HTTP/1.1\nHost: x\n", "\r", "\n"}, errBareLF},
		{[]string{"GET / HTTP/1.1\r\nA: b\r\n", "\r\n", "\nGET / HTTP/1.1\r\n", "Host: x\r\n\r\n"}, nil}, // the next head, after an empty line
		{[]string{"\x16\x03\x01\x00"}, errNotRequest},
		{[]string{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "\x16\x03"}, errNotRequest},
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
